// Every wire record parser behind one entry point, for fuzzing and tests: feeds `data` to the
// parser named by `kind` and reports what it accepted, or throws Error(kProtocol).
//   kind: "descriptor" (core/descriptor.h), "hello", "hello_ack" (transport/bootstrap.h),
//         "frame" (transport/tcp/wire.h), and with verbs: "endpoint_record", "control"
//         (transport/rdma/endpoint_record.h, control_msg.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rdmaxfer {

std::vector<std::string> record_kinds();
// Returns a one-line summary of the parsed record. Throws Error(kInvalidArgument) for an
// unknown kind and Error(kProtocol) for a record the parser rejects.
std::string parse_record(const std::string& kind, const uint8_t* data, size_t size);

}  // namespace rdmaxfer

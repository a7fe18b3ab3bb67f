// Every wire record parser behind one entry point, for fuzzing and tests: feeds `data` to the
// parser named by `kind` and reports what it accepted, or throws Error(kProtocol).
//   kind: "descriptor" (core/descriptor.h), "hello", "hello_ack" (transport/bootstrap.h),
//         "frame" (transport/wire.h), and those a transport registers for its own records
//         (a RecordRegistration in its folder; verbs: "endpoint_record", "control").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace rdmaxfer {

// Parses one record; returns a one-line summary, throws Error(kProtocol) when it rejects it.
using RecordParser = std::function<std::string(const uint8_t* data, size_t size)>;

// Constructing one (a static object in the transport's folder) adds `kind` to parse_record.
class RecordRegistration {
 public:
  RecordRegistration(std::string kind, RecordParser parse);
};

std::vector<std::string> record_kinds();
// Returns a one-line summary of the parsed record. Throws Error(kInvalidArgument) for an
// unknown kind and Error(kProtocol) for a record the parser rejects.
std::string parse_record(const std::string& kind, const uint8_t* data, size_t size);

}  // namespace rdmaxfer

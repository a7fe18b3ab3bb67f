// Stager::Op: one staged operation as post_*() queue it for a worker (staging.cc) and its
// pipeline runs it (staging_pipeline.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/descriptor.h"
#include "core/request.h"
#include "protocol/connection.h"
#include "protocol/message_windows.h"
#include "protocol/staging.h"

namespace rdmaxfer {

struct Stager::Op {
  enum class Kind { kWrite, kRead, kSend, kRecv };
  Kind kind = Kind::kWrite;
  std::shared_ptr<Connection> conn;
  uint64_t device = 0;
  uint64_t length = 0;
  Descriptor remote;
  uint64_t remote_offset = 0;
  std::string meta;
  uint64_t msg_id = 0;
  StagingOptions options;
  RequestPtr request;
  std::shared_ptr<SendWindows> windows;  // kSend: announced when posted (message_windows.h)
};

}  // namespace rdmaxfer

#include "common/error.h"

#include <cerrno>
#include <cstring>

namespace rdmaxfer {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kConnection: return "connection";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kRegistration: return "registration";
    case ErrorKind::kProtocol: return "protocol";
    case ErrorKind::kRemoteAccess: return "remote access";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kTransport: return "transport";
    case ErrorKind::kClosed: return "closed";
  }
  return "unknown";
}

Error::Error(ErrorKind kind, const std::string& message, int err_no, CompletionStatus completion)
    : std::runtime_error(message),
      kind_(kind),
      err_no_(err_no),
      completion_(std::move(completion)) {}

std::string errno_text(const std::string& op, int err_no) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may not be buf).
  const char* text = strerror_r(err_no, buf, sizeof(buf));
  return op + ": " + text + " (errno " + std::to_string(err_no) + ")";
}

void throw_errno(const std::string& op) { throw_errno(ErrorKind::kTransport, op, errno); }

void throw_errno(ErrorKind kind, const std::string& op, int err_no) {
  throw Error(kind, errno_text(op, err_no), err_no);
}

}  // namespace rdmaxfer

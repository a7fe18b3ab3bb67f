// Status of a failed operation, carried as one C++ exception type.
//
// Every error names the operation that failed and, where the OS or a verbs call set one, the
// errno with its text. bindings/errors.cc turns each ErrorKind into one Python exception class
// (rdmaxfer.errors); nothing else in csrc/ knows about Python.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace rdmaxfer {

enum class ErrorKind {
  kInvalidArgument,  // the caller passed a value that cannot work
  kConnection,       // connect refused, peer closed or reset the connection
  kTimeout,          // a bounded wait ran out
  kRegistration,     // memory could not be registered or pinned
  kProtocol,         // malformed or unsupported record on the wire, or a rejected message
  kRemoteAccess,     // the peer refused a one-sided access (bad key, out of bounds, read-only)
  kUnsupported,      // the transport or feature is not available here
  kTransport,        // a system or verbs call failed
  kClosed,           // the engine or endpoint was closed
};

const char* error_kind_name(ErrorKind kind);

// The status of a failed work completion (verbs): ibv_wc_status number and name, vendor_err.
struct CompletionStatus {
  int status = -1;  // -1: none
  std::string name;
  uint32_t vendor_err = 0;
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, int err_no = 0,
        CompletionStatus completion = {});
  ErrorKind kind() const { return kind_; }
  int err_no() const { return err_no_; }
  // The failed completion this error comes from; status -1 when none.
  const CompletionStatus& completion() const { return completion_; }

 private:
  ErrorKind kind_;
  int err_no_;
  CompletionStatus completion_;
};

// "op: strerror(err_no) (errno N)"; used for every failed system call.
std::string errno_text(const std::string& op, int err_no);

// Throws Error(kTransport) naming `op` and the current errno.
[[noreturn]] void throw_errno(const std::string& op);
[[noreturn]] void throw_errno(ErrorKind kind, const std::string& op, int err_no);

}  // namespace rdmaxfer

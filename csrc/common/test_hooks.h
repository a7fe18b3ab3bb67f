// Test hooks: the fault injection of the project's own tests, and the only place in csrc/ that
// reads a tests-only environment variable (python/rdmaxfer/_test_hooks.py lists them for
// `rdmaxfer info --config`). The shipped transports ask these functions, once per connection or
// channel; unset, every hook is off. Nobody outside the tests should set them.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "common/error.h"

namespace rdmaxfer::test_hooks {

// A "<device>:<bytes>" hook in environment variable `name`: (device, bytes), ("", 0) when unset.
// Throws Error(kInvalidArgument) for a value that is not DEVICE:BYTES.
inline std::pair<std::string, uint64_t> device_bytes_hook(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return {"", 0};
  const std::string text = env;
  const size_t colon = text.rfind(':');
  char* end = nullptr;
  const unsigned long long bytes =
      colon == std::string::npos ? 0 : std::strtoull(text.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || colon == 0 || end == nullptr || *end != '\0' || bytes == 0) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(name) + "='" + text + "' is not DEVICE:BYTES (e.g. rxe2:4194304; "
                "tests only: unset it)");
  }
  return {text.substr(0, colon), static_cast<uint64_t>(bytes)};
}

// RDMAXFER_RDMA_TEST_QP_ERR="<device>:<bytes>": once the rail on that device has carried `bytes`
// of one-sided chunks, the QP whose completion crossed it is moved to ERR, as a QP failing
// mid-transfer would be. Returns (device, bytes); ("", 0) when unset. Throws
// Error(kInvalidArgument) for a value that is not DEVICE:BYTES.
inline std::pair<std::string, uint64_t> rdma_qp_error() {
  return device_bytes_hook("RDMAXFER_RDMA_TEST_QP_ERR");
}

// RDMAXFER_OFI_TEST_RAIL_ERR="<domain>:<bytes>": on each ofi endpoint, once the rail on that
// domain has carried `bytes` of one-sided parts, the part whose completion crossed it reports
// a failure (as a rail failing mid-transfer would: its bytes may have landed). Returns
// (domain, bytes); ("", 0) when unset. Throws like rdma_qp_error.
inline std::pair<std::string, uint64_t> ofi_rail_error() {
  return device_bytes_hook("RDMAXFER_OFI_TEST_RAIL_ERR");
}

// RDMAXFER_OFI_TEST_LOST_READ="<domain>:<bytes>": on each ofi endpoint, once the rail on that
// domain has carried `bytes` of one-sided parts, the READ part whose completion crossed it is
// reported done with its bytes zeroed, and the rail fails right after (as verbs;ofi_rxm on
// soft-RoCE has reported a READ done without its data before its connection failed). Returns
// (domain, bytes); ("", 0) when unset. Throws like rdma_qp_error.
inline std::pair<std::string, uint64_t> ofi_lost_read() {
  return device_bytes_hook("RDMAXFER_OFI_TEST_LOST_READ");
}

// RDMAXFER_OFI_TEST_REJOIN_S="<seconds>": how long an ofi endpoint waits before it first asks a
// failed rail back (default 1; tests that look at a failed rail set it long). Throws
// Error(kInvalidArgument) for a value that is not a number of seconds above 0.
inline double ofi_rejoin_first_s() {
  const char* env = std::getenv("RDMAXFER_OFI_TEST_REJOIN_S");
  if (env == nullptr || *env == '\0') return 1.0;
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(s > 0)) {
    throw Error(ErrorKind::kInvalidArgument, "RDMAXFER_OFI_TEST_REJOIN_S='" + std::string(env) +
                                                 "' is not a number of seconds above 0 (tests "
                                                 "only: unset it)");
  }
  return s;
}

// RDMAXFER_RDMA_TEST_CTRL_TWICE=1: every control SEND is posted twice. Throws
// Error(kInvalidArgument) for a value other than 0 or 1.
inline bool rdma_ctrl_twice() {
  const char* env = std::getenv("RDMAXFER_RDMA_TEST_CTRL_TWICE");
  if (env == nullptr || *env == '\0' || std::string(env) == "0") return false;
  if (std::string(env) != "1") {
    throw Error(ErrorKind::kInvalidArgument, "RDMAXFER_RDMA_TEST_CTRL_TWICE='" +
                                                 std::string(env) +
                                                 "' is not 0 or 1 (tests only: unset it)");
  }
  return true;
}

// RDMAXFER_LOOPBACK_SWAP_CTS=1: the loopback channel holds the first windowed CTS of each
// message back and sends it after the next one (as a receiver granting from two threads can).
inline bool loopback_swap_cts() {
  const char* env = std::getenv("RDMAXFER_LOOPBACK_SWAP_CTS");
  return env != nullptr && std::string(env) == "1";
}

}  // namespace rdmaxfer::test_hooks

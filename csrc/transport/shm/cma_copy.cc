#include "transport/shm/cma_copy.h"

#include <sys/uio.h>

#include <algorithm>
#include <system_error>
#include <cerrno>
#include <thread>
#include <vector>

namespace rdmaxfer {

namespace {

// Below this a copy runs on the calling thread alone (thread start-up costs tens of us).
constexpr uint64_t kSplitBytes = 8ull << 20;
constexpr int kMaxThreads = 4;

int copy_range(pid_t pid, CmaDirection direction, uint8_t* local, uint64_t remote,
               uint64_t length) {
  while (length > 0) {
    iovec l{local, static_cast<size_t>(length)};
    iovec r{reinterpret_cast<void*>(remote), static_cast<size_t>(length)};
    const ssize_t n = direction == CmaDirection::kPull
                          ? process_vm_readv(pid, &l, 1, &r, 1, 0)
                          : process_vm_writev(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    local += n;
    remote += static_cast<uint64_t>(n);
    length -= static_cast<uint64_t>(n);
  }
  return 0;
}

}  // namespace

int cma_threads(uint64_t length) {
  if (length < kSplitBytes) return 1;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::min<uint64_t>(
      {static_cast<uint64_t>(kMaxThreads), static_cast<uint64_t>(cores), length / kSplitBytes}));
}

int cma_copy(pid_t pid, CmaDirection direction, uint8_t* local, uint64_t remote,
             uint64_t length) {
  const int n = cma_threads(length);
  if (n == 1) return copy_range(pid, direction, local, remote, length);
  // Page-aligned slices, the last one taking the rest.
  const uint64_t slice = (length / static_cast<uint64_t>(n)) & ~uint64_t{4095};
  std::vector<int> results(static_cast<size_t>(n), 0);
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<size_t>(n - 1));
  try {
    for (int i = 1; i < n; ++i) {
      const uint64_t off = slice * static_cast<uint64_t>(i);
      const uint64_t len = i == n - 1 ? length - off : slice;
      helpers.emplace_back([&results, i, pid, direction, local, remote, off, len] {
        results[static_cast<size_t>(i)] =
            copy_range(pid, direction, local + off, remote + off, len);
      });
    }
  } catch (const std::system_error& e) {
    for (auto& t : helpers) t.join();
    return e.code().value() != 0 ? e.code().value() : EAGAIN;  // no thread for a slice
  }
  results[0] = copy_range(pid, direction, local, remote, slice);
  for (auto& t : helpers) t.join();
  for (int r : results) {
    if (r != 0) return r;
  }
  return 0;
}

}  // namespace rdmaxfer

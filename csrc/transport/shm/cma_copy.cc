#include "transport/shm/cma_copy.h"

#include <limits.h>
#include <sys/uio.h>

#include <algorithm>
#include <system_error>
#include <cerrno>
#include <thread>
#include <vector>

#include "common/error.h"

namespace rdmaxfer {

namespace {

// Below this a copy runs on the calling thread alone (thread start-up costs tens of us).
constexpr uint64_t kSplitBytes = 8ull << 20;
constexpr int kMaxThreads = 4;

int threads_for(uint64_t length, uint64_t per_thread) {
  if (length < 2 * per_thread) return 1;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::min<uint64_t>(
      {static_cast<uint64_t>(kMaxThreads), static_cast<uint64_t>(cores), length / per_thread}));
}

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

// Copies pieces [at, end) (cma_copy_pieces), their errnos into `errors`; returns the failed.
size_t copy_pieces(pid_t pid, CmaDirection direction, const std::vector<CmaPiece>& pieces,
                   size_t at, size_t end, int* errors) {
  size_t failed = 0;
  uint64_t off = 0;  // bytes of piece `at` (the first not wholly copied) already copied
  std::vector<iovec> local;
  std::vector<iovec> remote;
  local.reserve(std::min<size_t>(end - at, IOV_MAX));
  remote.reserve(local.capacity());
  // Whether [base, ...) continues the last iovec of `list` (the kernel pins the peer's pages
  // once per remote iovec, so touching pieces go as one).
  auto touches = [](const std::vector<iovec>& list, const uint8_t* base) {
    return !list.empty() &&
           static_cast<const uint8_t*>(list.back().iov_base) + list.back().iov_len == base;
  };
  auto append = [&](std::vector<iovec>* list, uint8_t* base, uint64_t len) {
    if (touches(*list, base)) {
      list->back().iov_len += static_cast<size_t>(len);
    } else {
      list->push_back(iovec{base, static_cast<size_t>(len)});
    }
  };
  auto fail = [&](int err) {
    errors[at] = err;
    ++failed;
    ++at;
    off = 0;
  };
  while (at < end) {
    local.clear();
    remote.clear();
    for (size_t i = at; i < end; ++i) {
      const uint64_t skip = i == at ? off : 0;
      uint8_t* mine = pieces[i].local + skip;
      auto* theirs = reinterpret_cast<uint8_t*>(pieces[i].remote + skip);
      if ((local.size() == IOV_MAX && !touches(local, mine)) ||
          (remote.size() == IOV_MAX && !touches(remote, theirs))) {
        break;  // a list is full: this piece goes in the next call
      }
      append(&local, mine, pieces[i].length - skip);
      append(&remote, theirs, pieces[i].length - skip);
    }
    const ssize_t got =
        direction == CmaDirection::kPull
            ? process_vm_readv(pid, local.data(), local.size(), remote.data(), remote.size(), 0)
            : process_vm_writev(pid, local.data(), local.size(), remote.data(), remote.size(), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == ESRCH) {
      while (at < end) fail(ESRCH);
      break;
    }
    if (got <= 0) {
      fail(got < 0 ? errno : EFAULT);  // the first piece not copied; go on after it
      continue;
    }
    for (uint64_t left = static_cast<uint64_t>(got); left > 0;) {
      const uint64_t rest = pieces[at].length - off;
      if (left < rest) {
        off += left;
        break;
      }
      left -= rest;
      ++at;
      off = 0;
    }
  }
  return failed;
}

}  // namespace

size_t cma_copy_pieces(pid_t pid, CmaDirection direction, const std::vector<CmaPiece>& pieces,
                       std::vector<int>* errors) {
  errors->assign(pieces.size(), 0);
  return copy_pieces(pid, direction, pieces, 0, pieces.size(), errors->data());
}

std::string cma_failure(const char* what, int err, const std::string& peer) {
  if (err == ESRCH) return std::string(what) + " failed: peer " + peer + " exited";
  return errno_text(std::string(what) + " with peer " + peer, err);
}

int cma_threads(uint64_t length) { return threads_for(length, kSplitBytes); }

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

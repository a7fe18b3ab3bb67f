#include "core/notifier.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "common/error.h"

namespace rdmaxfer {

Notifier::Notifier() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!fd_.valid()) throw_errno("eventfd for completion notifications");
}

void Notifier::push(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(request_id);
  }
  uint64_t one = 1;
  // A full counter (EAGAIN) still leaves the fd readable, which is all a reader needs.
  ssize_t n = write(fd_.get(), &one, sizeof(one));
  (void)n;
}

std::vector<uint64_t> Notifier::drain() {
  uint64_t count = 0;
  ssize_t n = read(fd_.get(), &count, sizeof(count));
  (void)n;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> out;
  out.swap(ready_);
  return out;
}

}  // namespace rdmaxfer

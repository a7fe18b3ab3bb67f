// Completion notifications for event loops (asyncio): an eventfd that becomes readable when a
// watched request finishes, plus the queue of finished request ids. Written by I/O threads,
// drained by the thread that runs the event loop; never touches Python.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "common/unique_fd.h"

namespace rdmaxfer {

class Notifier {
 public:
  Notifier();
  int fd() const { return fd_.get(); }
  void push(uint64_t request_id);
  std::vector<uint64_t> drain();

 private:
  UniqueFd fd_;
  std::mutex mu_;
  std::vector<uint64_t> ready_;
};

}  // namespace rdmaxfer

// Whether a channel is closed and why, with the one text every transport gives a caller of a
// closed endpoint. Written once for the channels that keep it in memory (tcp, shm, loopback);
// not locked: the channel guards it with its own lock.
#pragma once

#include <string>
#include <utility>

#include "common/error.h"

namespace rdmaxfer {

class ClosedState {
 public:
  // Marks the channel closed for `reason`; false when it already was (the first reason stays).
  bool close(std::string reason) {
    if (closed_) return false;
    closed_ = true;
    reason_ = std::move(reason);
    return true;
  }
  bool closed() const { return closed_; }
  // Why it closed ("" while open).
  const std::string& reason() const { return reason_; }
  // Throws Error(kClosed) naming `peer` and the reason when closed.
  void check_open(const std::string& peer) const {
    if (closed_) {
      throw Error(ErrorKind::kClosed, "endpoint to " + peer + " is closed (" + reason_ +
                                          "); connect again to open a new endpoint");
    }
  }

 private:
  bool closed_ = false;
  std::string reason_;
};

}  // namespace rdmaxfer

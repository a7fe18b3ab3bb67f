// Windowed rendezvous: a two-sided message moved as a sequence of windows, each its own grant
// and WRITE with notification, so that neither end needs the whole message in one registered
// range. The staging pipeline (protocol/staging.h) moves GPU messages larger than a bounce slab
// this way, through a few slabs at each end, its device copies overlapped with the wire.
//
//   sender                                   receiver
//   RTS: size, meta; addr = its window:      w = the smaller of the sender's window and its
//     the most bytes one WRITE of it may       own (0: no limit); a message longer than w is
//     carry (0: any); key = its depth:         granted window by window, in offset order: a
//     windows it fills at once                 CTS with size = the window's bytes, addr + key
//                                              of its grant, meta = a window record {offset,
//                                              notification value}
//   windowed CTS: WRITE message[offset,      on_notify(value): the window landed, its grant is
//     offset + size) into the grant,           released; the next one is granted (into host
//     notifying the value                      or registered memory: at once, up to `ahead` in
//                                              flight; into a bounce slab: once the stager
//                                              copied the slab out)
//   done once every window was written       done once every window landed
//
// A window record may also cover a whole message (offset 0, size = the message): the receiver
// names its own notification value when the usual one (the low 32 bits of msg_id) is taken.
// Either end that fails in the middle of a windowed message aborts the connection: the other
// end would wait for windows that never come.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/region.h"
#include "core/request.h"
#include "transport/channel.h"

namespace rdmaxfer {

// One window as the sender sees it: where in the message, and the grant it goes to.
struct WindowGrant {
  uint64_t offset = 0;  // bytes into the message
  uint64_t length = 0;
  uint64_t addr = 0;    // the receiver's grant
  uint32_t key = 0;
  uint32_t value = 0;   // the notification the WRITE carries
  uint32_t route = 0;   // the grant's route (Grant)
};

// The CTS meta of a window: {offset, value}. decode throws Error(kProtocol) on anything else.
std::string encode_window(uint64_t offset, uint32_t value);
void decode_window(const std::string& meta, uint64_t* offset, uint32_t* value);

// The sender's side of a message that is granted window by window. With a source (a registered
// range holding the whole message) every window is written from it as soon as it is granted;
// without one (staging) the windows queue here and the owner writes each from where it put
// the bytes. `request` (the SEND) is done once every byte was written. Thread-safe.
class SendWindows : public std::enable_shared_from_this<SendWindows> {
 public:
  SendWindows(RequestPtr request, uint64_t length, const TransferOptions& options,
              std::weak_ptr<Channel> channel)
      : request_(std::move(request)), length_(length), options_(options),
        channel_(std::move(channel)) {}

  const RequestPtr& request() const { return request_; }
  void use_source(std::shared_ptr<MemoryRegion> region, uint64_t offset);
  // The protocol: the receiver granted `window` (validated: in order, inside the message).
  void granted(const WindowGrant& window);
  // The owner: the next granted window not yet taken.
  std::optional<WindowGrant> take();
  // Blocks up to `seconds` until a window is granted or the SEND is terminal.
  void wait(double seconds);
  // WRITEs `window.length` bytes at region[offset:] into the window's grant; the returned
  // request is done once they left (the SEND counts them then).
  RequestPtr write(const WindowGrant& window, const std::shared_ptr<MemoryRegion>& region,
                   uint64_t offset);

 private:
  void written(const Request& part);

  const RequestPtr request_;
  const uint64_t length_;
  const TransferOptions options_;
  const std::weak_ptr<Channel> channel_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<WindowGrant> granted_;
  std::shared_ptr<MemoryRegion> source_;
  uint64_t source_offset_ = 0;
  uint64_t written_ = 0;
};

// The receiver's side of a windowed message (guarded by the protocol's mutex). With a
// destination (host or registered memory) the protocol grants its windows itself, keeping
// `ahead` in flight; without one (staging) the owner grants each window into a slab of its own
// (MessageProtocol::grant_window).
struct RecvWindows {
  uint64_t msg_id = 0;
  RequestPtr request;   // the RECV: done once every window landed
  uint64_t length = 0;
  uint64_t window = 0;  // bytes per window (the last one shorter)
  std::shared_ptr<MemoryRegion> destination;  // null: the owner grants
  uint64_t destination_offset = 0;
  uint32_t ahead = 0;
  uint64_t next = 0;    // offset of the next window to grant
  uint64_t landed = 0;  // bytes landed
  struct Pending {
    uint64_t grant = 0;
    uint64_t length = 0;
    RequestPtr landed;  // done when the window's bytes are in place
  };
  std::unordered_map<uint32_t, Pending> pending;  // by notification value
};

// What the receiver knows of an announced, not yet received message.
struct Announcement {
  uint64_t length = 0;
  bool eager = false;
  uint64_t window = 0;  // the sender's window (0: it writes any window)
  uint32_t depth = 0;   // windows the sender fills at once
};

}  // namespace rdmaxfer

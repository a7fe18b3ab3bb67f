// A channel whose WRITE and READ share one path (shm, loopback): post_write and post_read are
// written once here, with the checks and bookkeeping every one-sided request gets first (both
// ranges inside their regions, the channel open, a request of the channel counted when
// terminal); the transport only moves the bytes.
#pragma once

#include <memory>

#include "core/descriptor.h"
#include "core/region.h"
#include "core/request.h"
#include "transport/channel.h"

namespace rdmaxfer {

class OneSidedChannel : public Channel {
 public:
  using Channel::Channel;

  RequestPtr post_write(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                        const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                        const TransferOptions& options) final {
    return post(OpKind::kWrite, local, local_offset, remote, remote_offset, length, options);
  }
  RequestPtr post_read(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                       const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                       const TransferOptions& options) final {
    return post(OpKind::kRead, local, local_offset, remote, remote_offset, length, options);
  }

 protected:
  // Moves `length` bytes for `request` (op kWrite: local -> remote; kRead: remote -> local),
  // the request checked and counted; completes or fails it (now or later).
  virtual void start_one_sided(OpKind op, const RequestPtr& request,
                               const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                               const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                               const TransferOptions& options) = 0;

 private:
  RequestPtr post(OpKind op, const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                  const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                  const TransferOptions& options) {
    const bool write = op == OpKind::kWrite;
    const char* what = write ? "WRITE" : "READ";
    check_local_range(local, local_offset, length, what,
                      write ? LocalUse::kSource : LocalUse::kDestination);
    check_remote_range(remote, remote_offset, length, what);
    check_peer_engine(remote, what);
    check_open();
    RequestPtr request = new_request(op, length);
    count_when_terminal(request, write ? "write" : "read");
    start_one_sided(op, request, local, local_offset, remote, remote_offset, length, options);
    return request;
  }
};

}  // namespace rdmaxfer

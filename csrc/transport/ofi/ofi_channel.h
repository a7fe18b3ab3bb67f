// One peer of the ofi transport (ofi_transport.h): the bootstrap stream for control messages
// and liveness, and the peer's address in the domain's address vector for the bytes.
//
// Lifecycle: made by the transport after the handshake (ofi_wire.h) -> start() (the stream's
// reader thread) -> operations -> closed: by close() (a goodbye sent), by the peer (goodbye or
// EOF: a peer that dies closes its stream) or by abort(). Closing fails every pending request
// with the reason and forgets the grants; operations already posted finish or fail in the
// domain (their memory stays held until then).
//
// One-sided WRITE/READ are fi_writemsg/fi_readmsg into the region the descriptor names (its key
// and, without FI_MR_VIRT_ADDR, the offset from the region's start); the provider enforces the
// MR's bounds and rights, so a revoked key or an access outside the region fails the request
// with kRemoteAccess. A notified write (post_write_notify) is cut into parts of
// notify_chunk bytes, each an fi_writemsg with remote CQ data = the grant's token; the target
// counts the parts of each grant and notifies once all of them landed, whatever their order.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/unique_fd.h"
#include "transport/channel.h"
#include "transport/ofi/ofi_domain.h"
#include "transport/ofi/ofi_wire.h"
#include "transport/tls.h"

namespace rdmaxfer {

class OfiTransport;

class OfiChannel : public Channel, public std::enable_shared_from_this<OfiChannel> {
 public:
  static constexpr uint64_t kEagerLimit = 16384;
  static constexpr uint64_t kNotifyChunk = 4ull << 20;  // largest part of a notified write

  // `fd`: the bootstrap stream (made non-blocking), `tls` its TLS session or null.
  OfiChannel(OfiTransport& transport, std::shared_ptr<OfiDomain> domain, UniqueFd fd,
             std::unique_ptr<TlsSession> tls, fi_addr_t peer_addr, uint64_t peer_max_msg,
             std::string peer);
  ~OfiChannel() override;
  // Starts the reader thread of the bootstrap stream.
  void start();

  RequestPtr post_write(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                        const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                        const TransferOptions& options) override;
  RequestPtr post_read(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                       const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                       const TransferOptions& options) override;
  void send_ctrl(const CtrlMessage& message, CtrlPayload payload) override;
  Grant grant(const std::shared_ptr<MemoryRegion>& local, uint64_t offset, uint64_t length,
              uint32_t value, const RequestPtr& progress) override;
  void release_grant(uint64_t id) override;
  void post_write_notify(const RequestPtr& request, const std::shared_ptr<MemoryRegion>& local,
                         uint64_t offset, uint64_t length, uint64_t addr, uint32_t key,
                         uint32_t route, uint32_t value, const TransferOptions& options) override;
  RequestPtr new_request(OpKind op, uint64_t bytes) override;
  ChannelLimits limits() const override;
  void check_open() const override;
  void close() override;
  void abort(ErrorKind kind, const std::string& reason) override;
  bool is_closed() const override;
  std::string error() const override;
  std::string peer() const override { return peer_; }
  int streams() const override { return 1; }
  std::string describe() const override;
  std::vector<std::pair<std::string, uint64_t>> attributes() const override;
  std::vector<std::pair<std::string, std::string>> names() const override;

  // A part of a notified write into grant `token` landed (the domain's completion thread).
  void on_landed(uint32_t token);

 private:
  struct GrantHold {
    RegionUse hold;
    OfiHandle<fid_mr> temp;  // a registration of the window alone (region without remote write)
    uint32_t value = 0;
    uint64_t length = 0;
    uint64_t parts = 1;
    uint64_t landed = 0;
    RequestPtr progress;
  };

  static void read_loop(std::weak_ptr<OfiChannel> self, std::shared_ptr<UniqueFd> fd,
                        std::shared_ptr<TlsSession> tls, std::string peer);
  const OfiRegion& ofi_region(const std::shared_ptr<MemoryRegion>& local, const char* what) const;
  RequestPtr one_sided(OpKind op, const std::shared_ptr<MemoryRegion>& local,
                       uint64_t local_offset, const Descriptor& remote, uint64_t remote_offset,
                       uint64_t length, const TransferOptions& options);
  // Posts [offset, offset+length) of `local` as one WRITE or READ part of `request`.
  void post_part(OpKind op, const RequestPtr& request, const std::shared_ptr<MemoryRegion>& local,
                 uint64_t offset, uint64_t length, uint64_t remote, uint32_t key,
                 const uint32_t* data);
  uint64_t parts_of(uint64_t length) const;
  void track(const RequestPtr& request);
  void send_frame(const OfiFrameHeader& header, const std::string& meta, const uint8_t* data);
  void shut(ErrorKind kind, const std::string& reason, bool goodbye);
  void check_open_locked() const;

  OfiTransport& transport_;
  const std::shared_ptr<OfiDomain> domain_;
  const std::shared_ptr<UniqueFd> fd_;
  const std::shared_ptr<TlsSession> tls_;  // null: a plain stream
  const fi_addr_t peer_addr_;
  const uint64_t max_chunk_;     // the largest RMA both endpoints take
  const uint64_t notify_chunk_;  // the part size of notified writes (the same on both sides)
  const std::string peer_;
  std::thread reader_;
  std::mutex send_mu_;
  mutable std::mutex mu_;
  bool closed_ = false;
  std::string error_;
  std::unordered_map<uint64_t, std::weak_ptr<Request>> inflight_;
  std::unordered_map<uint32_t, GrantHold> grants_;
};

}  // namespace rdmaxfer

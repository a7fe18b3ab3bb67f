// One peer of the ofi transport (ofi_transport.h): the bootstrap stream for control messages
// and liveness, and the peer's address in each rail's address vector for the bytes (rail i of
// this engine with the peer's rail i, as many as both have).
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
//
// Rails (ofi_rails.cc), as the verbs transport's (transport/rdma/rdma_connection.h):
//   striping   a one-sided transfer of kStripeMin bytes or more is shared among the live
//              rails by what each delivers now (transport/rail_meter.h: rates measured from
//              this endpoint's completions, water filling over what is queued on each, whole
//              pages, a rail far slower than the others left out and probed again later; a
//              rail not measured yet counts as the fastest measured one, and while none is,
//              the shares are equal), each share into parts; a smaller one goes on one rail:
//              the local region's home rail (the NIC nearest its GPU, set at registration)
//              while it is live and at least half as fast as the fastest, else the rail whose
//              queue with these bytes drains first.
//   failover   a part that fails on a rail with a connection or transport error marks the rail
//              failed on this endpoint and is posted again on a live rail (with that rail's
//              local descriptor and the descriptor's key there): the transfer completes. So
//              do the parts the rail completed for transfers still in flight (done_parts_):
//              a completion on a rail that fails before its transfer ends is not trusted, as
//              a provider may report a part done just before its connection fails without
//              its bytes having landed; and a part done on a rail already failed goes again
//              rather than counting. The peer is told (a RAIL_DOWN frame on the stream) and leaves the rail too. A part
//              the target refused (kRemoteAccess) fails its request on any rail, and so does
//              one that fails with a transport error again after it moved (the request's own
//              error, not a second rail's). A notified
//              write goes on the rail whose key its grant gave (the token's low bits,
//              OfiTransport::add_grant); when that rail fails, the notified write fails and the
//              endpoint stays (later grants take a live rail). When the last rail fails, the
//              endpoint closes with every rail's cause.
//   rejoining  a failed rail is asked back by the connecting side after a backoff (1 s
//              doubling to 60 s), each side drops the peer's entry in that rail's AV and
//              inserts it again (the provider's connection to the peer, in error after the
//              failure, is released) and reads the other's probe word over the rail; both read
//              right, the rail carries transfers again (ofi_heal.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/unique_fd.h"
#include "transport/channel.h"
#include "transport/ofi/ofi_domain.h"
#include "transport/ofi/ofi_wire.h"
#include "transport/rail_meter.h"
#include "transport/tls.h"

namespace rdmaxfer {

class OfiTransport;

// One rail of a channel: this engine's domain and the peer's entry in its AV.
struct OfiPeerRail {
  std::shared_ptr<OfiDomain> domain;
  std::shared_ptr<OfiPeer> peer;  // the peer's entry in the domain's AV
};

class OfiChannel : public Channel, public std::enable_shared_from_this<OfiChannel> {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr uint64_t kEagerLimit = 16384;
  static constexpr uint64_t kNotifyChunk = 4ull << 20;  // largest part of a notified write
  static constexpr uint64_t kStripeMin = 512 * 1024;    // smaller transfers go on one rail

  // `rails`: rail 0 first (at least one); `fd`: the bootstrap stream (made non-blocking),
  // `tls` its TLS session or null; `connector`: this side connected (it asks failed rails
  // back).
  OfiChannel(OfiTransport& transport, std::vector<OfiPeerRail> rails, UniqueFd fd,
             std::unique_ptr<TlsSession> tls, uint64_t peer_max_msg, std::string peer,
             bool connector);
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
  // The connecting side's rejoining step (ofi_heal.cc), from the transport's rail watch: asks
  // back each failed rail whose backoff ran out, and gives up on an attempt unanswered in time.
  void heal_tick();

 private:
  // A rail's rejoining (ofi_heal.cc), under mu_.
  struct RailHeal {
    uint64_t attempt = 0;   // the number of the last REJOIN sent (connector) or answered
    bool asking = false;    // that attempt is under way
    Clock::time_point next_try{};
    Clock::time_point deadline{};   // the connector's wait for the answer
    Clock::time_point healed_at{};  // the last rejoin
    double backoff_s = 0;
    uint64_t rejoins = 0;
    // The peer's AV entry's renewals when the rail failed: an entry renewed since (by another
    // endpoint to the same peer, which shares it) is not renewed again.
    uint64_t renewals = 0;
  };
  // Renews the peer's AV entry on `rail` unless it was renewed since the rail failed.
  void renew_peer(size_t rail);
  struct GrantHold {
    RegionUse hold;
    OfiHandle<fid_mr> temp;  // a registration of the window alone (region without remote write)
    uint32_t value = 0;
    uint64_t length = 0;
    uint64_t parts = 1;
    uint64_t landed = 0;
    RequestPtr progress;
  };

  // Where a part goes besides its rail: the remote address (the same on every rail) and the
  // remote keys by rail (from the descriptor; a notified write's: its grant's key alone).
  struct PartTarget {
    uint64_t remote = 0;
    std::shared_ptr<const std::vector<uint32_t>> keys;
    bool notified = false;  // carries the grant's token as CQ data: never moved to another rail
    uint32_t token = 0;
    int moves = 0;  // times the part moved to another rail
    bool counted = false;  // its bytes were counted already: a part done again
  };
  // A part done on its rail while its request is still in flight. Should the rail fail before
  // the request ends, the part is done again on a live rail: over verbs;ofi_rxm on soft-RoCE a
  // READ has been reported successful without its data, just before its connection failed.
  struct DonePart {
    OpKind op = OpKind::kRead;
    std::weak_ptr<Request> request;
    std::shared_ptr<MemoryRegion> local;
    uint64_t offset = 0;
    uint64_t length = 0;
    PartTarget target;
  };

  // The peer's words from a frame's metadata, bounded and printable (they end up in log lines
  // and exception messages).
  static std::string peer_text(const std::string& meta);
  static void read_loop(std::weak_ptr<OfiChannel> self, std::shared_ptr<UniqueFd> fd,
                        std::shared_ptr<TlsSession> tls, std::string peer);
  const OfiRegion& ofi_region(const std::shared_ptr<MemoryRegion>& local, const char* what) const;
  RequestPtr one_sided(OpKind op, const std::shared_ptr<MemoryRegion>& local,
                       uint64_t local_offset, const Descriptor& remote, uint64_t remote_offset,
                       uint64_t length, const TransferOptions& options);
  // Posts [offset, offset+length) of `local` as one WRITE or READ part of `request` on `rail`;
  // on a rail failure the part moves to a live rail (see above).
  void post_part(OpKind op, const RequestPtr& request, const std::shared_ptr<MemoryRegion>& local,
                 uint64_t offset, uint64_t length, size_t rail, const PartTarget& target);
  // A part's completion on `rail` (its domain's completion thread); err 0: success.
  void part_done(OpKind op, const RequestPtr& request, const std::shared_ptr<MemoryRegion>& local,
                 uint64_t offset, uint64_t length, size_t rail, const PartTarget& target,
                 int err, int prov_errno, const std::string& text);

  // Rails (ofi_rails.cc). A part done on `rail`: kept until its request ends, true; false when
  // the rail failed already, and the part goes again on a live rail (this completion does not
  // count).
  bool keep_done(OpKind op, const RequestPtr& request, const std::shared_ptr<MemoryRegion>& local,
                 uint64_t offset, uint64_t length, size_t rail, const PartTarget& target);
  // Posts `part` again on a live rail; `again`: it had counted as done (the request gets one
  // more part; nothing is posted once the request completed).
  void redo(const DonePart& part, bool again);
  // Posts a part again on a live rail (`moved`: its target, moves counted); the request fails
  // with `no_rail` when no live rail reaches the remote memory, or with the post's error.
  void move_part(OpKind op, const RequestPtr& request, const std::shared_ptr<MemoryRegion>& local,
                 uint64_t offset, uint64_t length, const PartTarget& moved,
                 const std::string& no_rail);
  // RDMAXFER_OFI_TEST_LOST_READ: a READ part that completed on `rail` (`carried` bytes there
  // so far) loses its bytes, and the rail fails.
  void test_lost_read(OpKind op, const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                      uint64_t length, size_t rail, uint64_t carried);
  // The live rails a transfer to memory with `keys` (by rail; 0: none
  // there) may use.
  std::vector<size_t> live_rails(const std::vector<uint32_t>& keys) const;
  // The rail a transfer of `length` bytes too small to stripe takes (see above).
  size_t pick_rail(const std::vector<size_t>& live, const MemoryRegion& local,
                   uint64_t length) const;
  // Splits [0, length) over `live` (see above): (rail, offset, bytes) per share that is not
  // empty.
  std::vector<std::tuple<size_t, uint64_t, uint64_t>> shares(const std::vector<size_t>& live,
                                                             uint64_t length);
  // Per rail of the endpoint, the rate shares count with (bytes/s): the measured one, or for a
  // rail of `live` not measured yet the fastest measured rate of `live` (1 while none is).
  std::vector<double> rail_rates(const std::vector<size_t>& live) const;
  // Rail `rail` failed (`cause`): marked failed, the peer told unless it told us; the endpoint
  // closes when no rail is left. Returns whether a rail is still live.
  bool rail_failed(size_t rail, const std::string& cause, bool tell_peer);
  // Rejoining (ofi_heal.cc). A frame of kinds kRejoin..kRailUp from the peer (its reader).
  void on_heal_frame(const OfiFrameHeader& h, const std::string& meta);
  // After `rail` failed: when to ask it back (the backoff doubles for a rail that flaps).
  void schedule_heal_locked(size_t rail);
  // Attempt `attempt` to bring `rail` back failed (`why`): the next one after the backoff.
  void heal_failed(size_t rail, uint64_t attempt, const std::string& why);
  // Attempt `attempt` brought `rail` back: live again, its rate not measured yet.
  void rail_rejoined(size_t rail, uint64_t attempt);
  // READs the peer's probe word (fabric address `addr`, key `key` on `rail`) over `rail`;
  // `then` gets "" when it came back as `expect`, else why not (on the completion thread).
  void probe(size_t rail, uint64_t addr, uint32_t key, uint64_t expect,
             std::function<void(const std::string&)> then);
  // Sends a rejoin frame about `rail` (with this side's probe word for kRejoin and kRejoinOk);
  // false when the stream did not take it in time.
  bool send_heal(OfiFrameKind kind, size_t rail, uint64_t attempt, const std::string& why);
  // This endpoint's probe word: a small region on every rail that the peer READs.
  std::shared_ptr<MemoryRegion> probe_word();

  bool rail_live(size_t rail) const;
  // The lowest live rail (grants give its key); throws Error(kConnection) when none is.
  size_t grant_rail() const;
  // "rxe0 up, 4194304 bytes, 812.5 MB/s, 61% of the last striped transfer; rxe2 failed (...),
  // ..."
  std::string rails_text() const;
  uint64_t parts_of(uint64_t length) const;
  void track(const RequestPtr& request);
  // Sends one frame on the stream; waits at most `timeout_s` for the stream, then as long
  // again for the peer to take it (throws Error(kTimeout), or kConnection when it is gone).
  void send_frame(const OfiFrameHeader& header, const std::string& meta, const uint8_t* data,
                  double timeout_s);
  void shut(ErrorKind kind, const std::string& reason, bool goodbye);
  void check_open_locked() const;

  OfiTransport& transport_;
  const std::vector<OfiPeerRail> rails_;
  const std::shared_ptr<OfiDomain> domain_;  // rail 0's: the settings every rail shares
  const std::shared_ptr<UniqueFd> fd_;
  const std::shared_ptr<TlsSession> tls_;  // null: a plain stream
  const uint64_t max_chunk_;     // the largest RMA both endpoints take
  const uint64_t notify_chunk_;  // the part size of notified writes (the same on both sides)
  const std::string peer_;
  const bool connector_;
  const double heal_first_s_;  // the first backoff (common/test_hooks.h may change it)
  std::thread reader_;
  std::timed_mutex send_mu_;
  mutable std::mutex mu_;
  bool closed_ = false;
  std::string error_;
  std::unordered_map<uint64_t, std::weak_ptr<Request>> inflight_;
  std::unordered_map<uint32_t, GrantHold> grants_;
  std::vector<char> rail_up_;            // mu_
  std::vector<std::string> rail_cause_;  // mu_: why each failed rail failed
  std::unique_ptr<std::atomic<uint64_t>[]> rail_bytes_;  // landed, per rail
  RailMeter meter_;  // per rail: measured rate, bytes posted and not complete, last share
  std::vector<RailHeal> heal_;            // mu_
  // Per rail, the parts done there for requests in flight, by request id.
  std::vector<std::unordered_map<uint64_t, std::vector<DonePart>>> done_parts_;  // mu_
  std::shared_ptr<MemoryRegion> probe_;   // mu_: made on first use
  uint64_t probe_value_ = 0;              // the probe word's value (random, never 0)
  // RDMAXFER_OFI_TEST_RAIL_ERR (common/test_hooks.h): the rail whose part completing after
  // test_err_bytes_ reports a failure once (SIZE_MAX: none).
  size_t test_err_rail_ = SIZE_MAX;
  uint64_t test_err_bytes_ = 0;
  std::atomic<bool> test_err_fired_{false};
  // RDMAXFER_OFI_TEST_LOST_READ: the same for a READ part that loses its bytes.
  size_t test_lost_rail_ = SIZE_MAX;
  uint64_t test_lost_bytes_ = 0;
  std::atomic<bool> test_lost_fired_{false};
};

}  // namespace rdmaxfer

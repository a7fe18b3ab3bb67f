// Batches of one-sided WRITEs or READs, built once for every transport on a Channel's
// post_write / post_read (transport/channel.h), like Mooncake's batch_transfer or NIXL's
// descriptor lists.
//
// A BatchPlan is made once from the entries (validated, zero-length ones skipped, neighbours
// contiguous on both sides merged into one operation) and may be posted again and again
// (a prepared batch). A BatchRun posts one plan: at most `window` channel requests
// outstanding at once (an operation posted alone, or a gathered group of as many pieces as the
// transport's limits allow: transport/gather.h), and gathered pieces in flight at most
// kGroupsInFlight full groups' worth (pieces and bytes), so that the target has the next
// group queued while it places one. The next request is posted as an earlier one completes,
// so a batch of hundreds of thousands of entries holds a bounded number of requests. Each
// operation forwards its progress to the batch's request as its bytes move
// (Request::forward_progress), so the batch's inactivity bound holds while a long operation
// still moves bytes. Every operation's
// failure is recorded against its entries while the rest go on. With a notification the run
// sends a NOTIFY control message once every operation completed (on every lane that carried
// it) and none failed; the peer's protocol queues it (protocol/notifications.h).
//
//   run.request(): pending -> done (failures() lists the entries that failed and why) or
//   failed (the channel closed under it, or the NOTIFY could not be sent).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "protocol/notifications.h"
#include "transport/channel.h"
#include "transport/gather.h"

namespace rdmaxfer {

// The entries as the caller names them: `count` rows of five words each (region index, local
// offset, descriptor index, remote offset, length), indices into the plan's regions and
// remotes. Read in place: the caller keeps them alive while the plan is made.
struct BatchRows {
  static constexpr size_t kColumns = 5;
  const uint64_t* data = nullptr;
  size_t count = 0;
};

// One entry: indices into the plan's regions and remotes.
struct BatchEntry {
  uint32_t region = 0;
  uint64_t local_offset = 0;
  uint32_t remote = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// An entry that failed: its index, the kind of error and why.
struct BatchFailure {
  uint64_t entry = 0;
  ErrorKind kind = ErrorKind::kTransport;
  std::string reason;
};

class BatchPlan {
 public:
  // One operation: entries [first, last] merged (skipped ones among them move nothing).
  struct Op {
    BatchEntry at;
    uint64_t first = 0;
    uint64_t last = 0;
  };

  // Checks each entry (indices, the local range inside its region and allowed for `op`, the
  // remote range inside its descriptor); an entry that fails is recorded in invalid() and left
  // out, the others are planned. Throws Error(kInvalidArgument) for an op other than WRITE or
  // READ.
  // A region's state (revoked, local write) is checked at its first entry, each entry's
  // ranges on their own.
  BatchPlan(OpKind op, std::vector<std::shared_ptr<MemoryRegion>> regions,
            std::vector<Descriptor> remotes, BatchRows rows, const TransferOptions& options);

  OpKind op() const { return op_; }
  const std::vector<Op>& ops() const { return ops_; }
  const std::shared_ptr<MemoryRegion>& region(uint32_t i) const { return regions_[i]; }
  uint32_t region_count() const { return static_cast<uint32_t>(regions_.size()); }
  const Descriptor& remote(uint32_t i) const { return remotes_[i]; }
  uint32_t remote_count() const { return static_cast<uint32_t>(remotes_.size()); }
  const TransferOptions& options() const { return options_; }
  // Entries refused at planning, with the reason, in entry order.
  const std::vector<BatchFailure>& invalid() const { return invalid_; }
  bool skipped(uint64_t entry) const { return skipped_[entry]; }
  uint64_t entries() const { return skipped_.size(); }
  uint64_t skipped_count() const { return skipped_count_; }
  uint64_t bytes() const { return bytes_; }

 private:
  OpKind op_;
  std::vector<std::shared_ptr<MemoryRegion>> regions_;
  std::vector<Descriptor> remotes_;
  TransferOptions options_;
  std::vector<Op> ops_;
  std::vector<BatchFailure> invalid_;
  std::vector<bool> skipped_;  // zero-length or invalid: not moved
  uint64_t skipped_count_ = 0;  // zero-length entries
  uint64_t bytes_ = 0;
};

class BatchRun : public std::enable_shared_from_this<BatchRun> {
 public:
  // Channel requests outstanding at once unless the caller says otherwise.
  static constexpr uint32_t kDefaultWindow = 256;
  // Gathered groups in flight at once, counted in full groups of the transport's limits.
  static constexpr uint64_t kGroupsInFlight = 4;
  // Evened-out groups hold at least 1/kMinEvenFraction of the transport's limits.
  static constexpr uint64_t kMinEvenFraction = 8;

  // Posts `plan` on `channel` (window >= 1), then `notify` when every operation succeeded.
  // `whole`: the request fails with the first entry's error when any entry fails (one WRITE
  // with a notification is posted as a batch of one).
  static std::shared_ptr<BatchRun> start(const std::shared_ptr<Channel>& channel,
                                         std::shared_ptr<const BatchPlan> plan,
                                         std::optional<NotifyPayload> notify, uint32_t window,
                                         bool whole = false);

  const RequestPtr& request() const { return request_; }
  // The failed entries with their reasons, in entry order (complete once request() is done).
  std::vector<BatchFailure> failures() const;
  // The most channel requests that were outstanding at once (never above window()).
  uint32_t peak_outstanding() const;
  uint32_t window() const { return window_; }
  uint64_t operations() const { return plan_->ops().size(); }
  bool notified() const;
  // Bytes of the operations that completed.
  uint64_t bytes_done() const;

 private:
  BatchRun(const std::shared_ptr<Channel>& channel, std::shared_ptr<const BatchPlan> plan,
           std::optional<NotifyPayload> notify, uint32_t window, bool whole);
  // Evens out the groups of each region's gathered pieces when they need more than one: as
  // few groups as the limits allow, rounded up to a multiple of kGroupsInFlight, of about
  // equal pieces and bytes (at least 1/kMinEvenFraction of the limits), so that the groups in
  // flight, copied in parallel (the shm target's gather workers, TCP's streams), end together:
  // cut at the limits, 10,000 4 KiB pieces on shm made groups of 2,048, 2,048, 2,048, 2,048
  // and 1,808, and with four gather workers the last one was copied alone after the others
  // (now 8 groups of 1,250).
  void even_out_groups();
  // Posts operations until the window is full; run by whoever frees a slot (one at a time: a
  // caller that finds another one posting leaves it a note to look again).
  void pump();
  // The operations from `first` on that go as one group (count 1: posted alone).
  struct Group {
    size_t count = 1;
    uint64_t bytes = 0;
  };
  Group group_at(size_t first) const;
  // Whether gathered group `g` of `limits` may be posted now (mu_ held).
  bool room_for(const Group& g, const GatherLimits& limits) const;
  void post(size_t index);
  void post_group(size_t first, const Group& g);
  // `done`: the operation's request, terminal; null when it could not be posted (`why`).
  void op_done(size_t index, const Request* done, const Error* why);
  // Pieces of a group the target refused: (index in the group, why).
  using Refusals = std::vector<std::pair<size_t, Error>>;
  // The group [first, first + count) is over: `done` its request (`told`: the pieces the
  // target refused), or null when it could not be posted (`why`).
  void group_done(size_t first, size_t count, uint64_t bytes, const Refusals& told,
                  const Request* done, const Error* why);
  // The batch's request learns of an operation (or group) that ended having moved `moved`
  // bytes: those its request `done` did not forward already, or activity alone.
  void note_rest(uint64_t moved, const Request* done);
  void finish();

  std::weak_ptr<Channel> channel_;
  std::shared_ptr<const BatchPlan> plan_;
  std::optional<NotifyPayload> notify_;
  const uint32_t window_;
  const bool whole_;
  // Per region of the plan: what one group may hold (max_pieces 0: the channel does not
  // gather this op from/into it).
  std::vector<GatherLimits> gather_;
  RequestPtr request_;

  mutable std::mutex mu_;
  size_t next_ = 0;
  uint32_t outstanding_ = 0;
  uint64_t gathered_pieces_ = 0;  // of the gathered groups in flight
  uint64_t gathered_bytes_ = 0;
  uint32_t peak_ = 0;
  uint64_t bytes_done_ = 0;
  bool pumping_ = false;
  bool again_ = false;
  bool finishing_ = false;
  bool notified_ = false;
  std::vector<std::pair<size_t, Error>> failed_ops_;  // op index, why
};

}  // namespace rdmaxfer

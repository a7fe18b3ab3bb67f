#include "protocol/batch.h"

#include <algorithm>

#include "common/error.h"

namespace rdmaxfer {

BatchPlan::BatchPlan(OpKind op, std::vector<std::shared_ptr<MemoryRegion>> regions,
                     std::vector<Descriptor> remotes, BatchRows rows,
                     const TransferOptions& options)
    : op_(op),
      regions_(std::move(regions)),
      remotes_(std::move(remotes)),
      options_(options),
      skipped_(rows.count, false) {
  if (op != OpKind::kWrite && op != OpKind::kRead) {
    throw Error(ErrorKind::kInvalidArgument, "a batch holds WRITEs or READs only");
  }
  const char* what = op == OpKind::kWrite ? "WRITE" : "READ";
  const LocalUse use = op == OpKind::kWrite ? LocalUse::kSource : LocalUse::kDestination;
  // Regions whose state passed check_local_range once: their later entries need the bounds
  // alone (check_local_range again only to say why one is out of bounds).
  std::vector<char> region_ok(regions_.size(), 0);
  ops_.reserve(rows.count);
  for (uint64_t i = 0; i < rows.count; ++i) {
    const uint64_t* row = rows.data + i * BatchRows::kColumns;
    BatchEntry e;
    e.region = static_cast<uint32_t>(std::min<uint64_t>(row[0], UINT32_MAX));
    e.local_offset = row[1];
    e.remote = static_cast<uint32_t>(std::min<uint64_t>(row[2], UINT32_MAX));
    e.remote_offset = row[3];
    e.length = row[4];
    if (e.length == 0) {
      skipped_[i] = true;
      ++skipped_count_;
      continue;
    }
    try {
      if (e.region >= regions_.size() || e.remote >= remotes_.size()) {
        throw Error(ErrorKind::kInvalidArgument, "region or descriptor index out of range");
      }
      const std::shared_ptr<MemoryRegion>& local = regions_[e.region];
      if (region_ok[e.region] == 0 || e.local_offset > local->length() ||
          e.length > local->length() - e.local_offset) {
        check_local_range(local, e.local_offset, e.length, what, use);
        region_ok[e.region] = 1;
      }
      check_remote_range(remotes_[e.remote], e.remote_offset, e.length, what);
    } catch (const Error& err) {
      skipped_[i] = true;
      invalid_.push_back(BatchFailure{i, err.kind(), err.what()});
      continue;
    }
    bytes_ += e.length;
    if (!ops_.empty()) {
      Op& prev = ops_.back();
      BatchEntry& at = prev.at;
      if (at.region == e.region && at.remote == e.remote &&
          at.local_offset + at.length == e.local_offset &&
          at.remote_offset + at.length == e.remote_offset) {
        at.length += e.length;
        prev.last = i;
        continue;
      }
    }
    ops_.push_back(Op{e, i, i});
  }
}

std::shared_ptr<BatchRun> BatchRun::start(const std::shared_ptr<Channel>& channel,
                                          std::shared_ptr<const BatchPlan> plan,
                                          std::optional<NotifyPayload> notify, uint32_t window,
                                          bool whole) {
  if (window == 0) throw Error(ErrorKind::kInvalidArgument, "a batch window must be >= 1");
  channel->check_open();
  // Every descriptor names memory of the peer's engine: else nothing of the batch is posted.
  const char* what = plan->op() == OpKind::kWrite ? "WRITE batch" : "READ batch";
  for (uint32_t i = 0; i < plan->remote_count(); ++i) channel->check_peer_engine(plan->remote(i), what);
  std::shared_ptr<BatchRun> run(
      new BatchRun(channel, std::move(plan), std::move(notify), window, whole));
  run->pump();
  return run;
}

BatchRun::BatchRun(const std::shared_ptr<Channel>& channel, std::shared_ptr<const BatchPlan> plan,
                   std::optional<NotifyPayload> notify, uint32_t window, bool whole)
    : channel_(channel),
      plan_(std::move(plan)),
      notify_(std::move(notify)),
      window_(window),
      whole_(whole),
      request_(channel->new_request(plan_->op(), plan_->bytes())) {
  const auto* writes = dynamic_cast<const GatherWrites*>(channel.get());
  const auto* reads = dynamic_cast<const GatherReads*>(channel.get());
  const bool write = plan_->op() == OpKind::kWrite;
  gather_.resize(plan_->region_count());
  for (uint32_t r = 0; r < plan_->region_count(); ++r) {
    const MemoryRegion& local = *plan_->region(r);
    if (write && writes != nullptr) gather_[r] = writes->gather_limits(local);
    if (!write && reads != nullptr) gather_[r] = reads->read_gather_limits(local);
  }
  even_out_groups();
}

void BatchRun::even_out_groups() {
  const uint32_t regions = plan_->region_count();
  std::vector<uint64_t> pieces(regions, 0);
  std::vector<uint64_t> bytes(regions, 0);
  std::vector<uint64_t> largest(regions, 0);
  for (const BatchPlan::Op& op : plan_->ops()) {
    const GatherLimits& limits = gather_[op.at.region];
    if (limits.max_pieces == 0 || op.at.length > limits.max_piece_bytes) continue;
    ++pieces[op.at.region];
    bytes[op.at.region] += op.at.length;
    largest[op.at.region] = std::max(largest[op.at.region], op.at.length);
  }
  auto ceil_div = [](uint64_t a, uint64_t b) { return (a + b - 1) / b; };
  for (uint32_t r = 0; r < regions; ++r) {
    GatherLimits& limits = gather_[r];
    if (pieces[r] == 0 || limits.max_bytes == 0) continue;
    const uint64_t by_pieces = ceil_div(pieces[r], limits.max_pieces);
    const uint64_t by_bytes = ceil_div(bytes[r], limits.max_bytes);
    if (std::max(by_pieces, by_bytes) < 2) continue;  // one group: nothing to even out
    const uint64_t groups = ceil_div(std::max(by_pieces, by_bytes), kGroupsInFlight) *
                            kGroupsInFlight;
    const uint64_t fewest = std::max<uint64_t>(1, limits.max_pieces / kMinEvenFraction);
    limits.max_pieces = static_cast<size_t>(std::min<uint64_t>(
        limits.max_pieces, std::max(fewest, ceil_div(pieces[r], groups))));
    // A group closes before the piece that would pass the cap: a piece's worth over the even
    // share keeps every group at least at that share (no short group at the end).
    const uint64_t even_bytes = ceil_div(bytes[r], groups) + largest[r];
    limits.max_bytes =
        std::min(limits.max_bytes, std::max(limits.max_bytes / kMinEvenFraction, even_bytes));
  }
}

void BatchRun::pump() {
  std::unique_lock<std::mutex> lock(mu_);
  if (pumping_) {
    again_ = true;
    return;
  }
  pumping_ = true;
  const size_t total = plan_->ops().size();
  do {
    again_ = false;
    while (outstanding_ < window_ && next_ < total) {
      const size_t first = next_;
      const Group g = group_at(first);
      if (g.count > 1) {
        if (!room_for(g, gather_[plan_->ops()[first].at.region])) break;
        gathered_pieces_ += g.count;
        gathered_bytes_ += g.bytes;
      }
      next_ += g.count;
      ++outstanding_;
      peak_ = std::max(peak_, outstanding_);
      lock.unlock();
      if (g.count == 1) {
        post(first);
      } else {
        post_group(first, g);
      }
      lock.lock();
    }
  } while (again_);
  pumping_ = false;
  const bool last = next_ == total && outstanding_ == 0 && !finishing_;
  if (last) finishing_ = true;
  lock.unlock();
  if (last) finish();
}

BatchRun::Group BatchRun::group_at(size_t first) const {
  const std::vector<BatchPlan::Op>& ops = plan_->ops();
  const GatherLimits& limits = gather_[ops[first].at.region];
  const size_t most = std::min(limits.max_pieces, ops.size() - first);
  Group g{0, 0};
  while (g.count < most) {
    const BatchEntry& at = ops[first + g.count].at;
    if (at.length > limits.max_piece_bytes || g.bytes + at.length > limits.max_bytes ||
        at.region != ops[first].at.region) {
      break;
    }
    g.bytes += at.length;
    ++g.count;
  }
  if (g.count == 0) return Group{1, ops[first].at.length};
  return g;
}

bool BatchRun::room_for(const Group& g, const GatherLimits& limits) const {
  if (gathered_pieces_ == 0) return true;  // one group is always allowed
  return gathered_pieces_ + g.count <= kGroupsInFlight * limits.max_pieces &&
         gathered_bytes_ + g.bytes <= kGroupsInFlight * limits.max_bytes;
}

void BatchRun::post_group(size_t first, const Group& g) {
  const size_t count = g.count;
  std::shared_ptr<Channel> channel = channel_.lock();
  const bool write = plan_->op() == OpKind::kWrite;
  auto* writes = write ? dynamic_cast<GatherWrites*>(channel.get()) : nullptr;
  auto* reads = write ? nullptr : dynamic_cast<GatherReads*>(channel.get());
  if (writes == nullptr && reads == nullptr) {
    const Error gone(ErrorKind::kClosed, "the endpoint was destroyed");
    group_done(first, count, g.bytes, Refusals(), nullptr, &gone);
    return;
  }
  std::vector<GatherPiece> pieces(count);
  for (size_t i = 0; i < count; ++i) {
    const BatchEntry& op = plan_->ops()[first + i].at;
    pieces[i] = GatherPiece{op.local_offset, plan_->remote(op.remote), op.remote_offset, op.length};
  }
  std::shared_ptr<BatchRun> self = shared_from_this();
  RequestPtr part;
  // The pieces the target refused, told before the group's request completes.
  auto refused = std::make_shared<Refusals>();
  PieceFailed failed = [self, refused](size_t index, const Error& why) {
    std::lock_guard<std::mutex> lock(self->mu_);
    refused->emplace_back(index, why);
  };
  const std::shared_ptr<MemoryRegion>& local = plan_->region(plan_->ops()[first].at.region);
  try {
    part = writes != nullptr ? writes->post_write_gather(local, pieces, std::move(failed))
                             : reads->post_read_gather(local, pieces, std::move(failed));
  } catch (const Error& e) {
    group_done(first, count, g.bytes, Refusals(), nullptr, &e);
    return;
  }
  part->forward_progress(request_);
  part->then([self, first, count, bytes = g.bytes, refused](const Request& done) {
    Refusals told;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      told.swap(*refused);
    }
    self->group_done(first, count, bytes, told, &done, nullptr);
  });
}

void BatchRun::group_done(size_t first, size_t count, uint64_t bytes, const Refusals& told,
                          const Request* done, const Error* why) {
  const std::vector<BatchPlan::Op>& ops = plan_->ops();
  uint64_t moved = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --outstanding_;
    gathered_pieces_ -= count;
    gathered_bytes_ -= bytes;
    std::vector<bool> refused(count, false);
    for (const auto& [index, error] : told) {
      if (index >= count || refused[index]) continue;
      refused[index] = true;
      failed_ops_.emplace_back(first + index, error);
    }
    const bool ok = done != nullptr && done->state() == Request::State::kDone;
    for (size_t i = 0; i < count; ++i) {
      if (ok && !refused[i]) {
        moved += ops[first + i].at.length;
      } else if (!refused[i]) {
        failed_ops_.emplace_back(first + i, done ? Error(done->error_kind(),
                                                         done->error_message())
                                                 : *why);
      }
    }
    bytes_done_ += moved;
  }
  note_rest(moved, done);
  pump();
}

void BatchRun::post(size_t index) {
  const BatchEntry& op = plan_->ops()[index].at;
  std::shared_ptr<Channel> channel = channel_.lock();
  if (!channel) {
    const Error gone(ErrorKind::kClosed, "the endpoint was destroyed");
    op_done(index, nullptr, &gone);
    return;
  }
  RequestPtr part;
  try {
    part = plan_->op() == OpKind::kWrite
               ? channel->post_write(plan_->region(op.region), op.local_offset,
                                     plan_->remote(op.remote), op.remote_offset, op.length,
                                     plan_->options())
               : channel->post_read(plan_->region(op.region), op.local_offset,
                                    plan_->remote(op.remote), op.remote_offset, op.length,
                                    plan_->options());
  } catch (const Error& e) {
    op_done(index, nullptr, &e);
    return;
  }
  part->forward_progress(request_);
  std::shared_ptr<BatchRun> self = shared_from_this();
  part->then([self, index](const Request& done) { self->op_done(index, &done, nullptr); });
}

void BatchRun::op_done(size_t index, const Request* done, const Error* why) {
  const bool ok = done != nullptr && done->state() == Request::State::kDone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --outstanding_;
    if (ok) bytes_done_ += plan_->ops()[index].at.length;
    if (!ok) {
      failed_ops_.emplace_back(index, done ? Error(done->error_kind(), done->error_message())
                                           : *why);
    }
  }
  note_rest(ok ? plan_->ops()[index].at.length : 0, done);
  pump();
}

void BatchRun::note_rest(uint64_t moved, const Request* done) {
  const uint64_t told = done != nullptr ? done->forwarded_bytes() : 0;
  request_->note_progress(moved > told ? moved - told : 0);
}

void BatchRun::finish() {
  std::shared_ptr<Channel> channel = channel_.lock();
  bool any_failed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    any_failed = !failed_ops_.empty() || !plan_->invalid().empty();
  }
  if (any_failed && channel && channel->is_closed()) {
    request_->fail(ErrorKind::kConnection, "the endpoint to " + channel->peer() +
                                               " failed during the batch: " + channel->error());
    return;
  }
  if (any_failed && whole_) {
    const BatchFailure first = failures().front();
    request_->fail(first.kind, first.reason);
    return;
  }
  if (notify_ && !any_failed) {
    try {
      if (!channel) throw Error(ErrorKind::kClosed, "the endpoint was destroyed");
      channel->send_ctrl(notify_->message(request_->id()), CtrlPayload());
    } catch (const Error& e) {
      request_->fail(e.kind(), std::string("the bytes were placed but the notification could "
                                           "not be sent: ") + e.what());
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    notified_ = true;
  }
  request_->complete();
}

std::vector<BatchFailure> BatchRun::failures() const {
  std::vector<BatchFailure> out(plan_->invalid());
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [index, why] : failed_ops_) {
    const BatchPlan::Op& op = plan_->ops()[index];
    for (uint64_t e = op.first; e <= op.last; ++e) {
      if (!plan_->skipped(e)) out.push_back(BatchFailure{e, why.kind(), why.what()});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const BatchFailure& a, const BatchFailure& b) { return a.entry < b.entry; });
  return out;
}

uint32_t BatchRun::peak_outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

uint64_t BatchRun::bytes_done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_done_;
}

bool BatchRun::notified() const {
  std::lock_guard<std::mutex> lock(mu_);
  return notified_;
}

}  // namespace rdmaxfer

// Stager (staging.h): operations posted and queued, the workers that run them one after the
// other (each through its pipeline, staging_pipeline.cc), close() and the counts. Messages of
// host memory go direct (post_send_direct, post_recv_direct).
#include "protocol/staging.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "common/error.h"
#include "protocol/staging_op.h"
#include "transport/bounce_pool.h"

namespace rdmaxfer {

Stager::Stager(Transport& transport, std::shared_ptr<DeviceCopier> copier)
    : transport_(transport), copier_(std::move(copier)) {
  if (!copier_) throw Error(ErrorKind::kInvalidArgument, "Stager needs a device copier");
}

Stager::~Stager() { close(); }

RequestPtr Stager::post_one_sided(bool write, const std::shared_ptr<Connection>& conn,
                                  uint64_t device, uint64_t length, const Descriptor& remote,
                                  uint64_t remote_offset, const StagingOptions& options) {
  auto op = std::make_unique<Op>();
  op->kind = write ? Op::Kind::kWrite : Op::Kind::kRead;
  op->conn = conn;
  op->device = device;
  op->length = length;
  op->remote = remote;
  op->remote_offset = remote_offset;
  op->options = options;
  return start(std::move(op));
}

RequestPtr Stager::post_write(const std::shared_ptr<Connection>& conn, uint64_t device,
                              uint64_t length, const Descriptor& remote, uint64_t remote_offset,
                              const StagingOptions& options) {
  return post_one_sided(true, conn, device, length, remote, remote_offset, options);
}

RequestPtr Stager::post_read(const std::shared_ptr<Connection>& conn, uint64_t device,
                             uint64_t length, const Descriptor& remote, uint64_t remote_offset,
                             const StagingOptions& options) {
  return post_one_sided(false, conn, device, length, remote, remote_offset, options);
}

RequestPtr Stager::post_send(const std::shared_ptr<Connection>& conn, uint64_t device,
                             uint64_t length, const std::string& meta,
                             const StagingOptions& options) {
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::kSend;
  op->conn = conn;
  op->device = device;
  op->length = length;
  op->meta = meta;
  op->options = options;
  return start(std::move(op));
}

RequestPtr Stager::post_recv(const std::shared_ptr<Connection>& conn, uint64_t msg_id,
                             uint64_t device, uint64_t length, const StagingOptions& options) {
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::kRecv;
  op->conn = conn;
  op->msg_id = msg_id;
  op->device = device;
  op->length = length;
  op->options = options;
  return start(std::move(op));
}

RequestPtr Stager::post_send_direct(const std::shared_ptr<Connection>& conn,
                                    const std::shared_ptr<MemoryRegion>& region, uint64_t offset,
                                    uint64_t length, const std::string& meta,
                                    const StagingOptions& options) {
  if (!conn) throw Error(ErrorKind::kInvalidArgument, "staging: no endpoint");
  RequestPtr request = conn->post_send(region, offset, length, meta, options.wire, false);
  messages_direct_.fetch_add(1, std::memory_order_relaxed);
  return request;
}

RequestPtr Stager::post_recv_direct(const std::shared_ptr<Connection>& conn, uint64_t msg_id,
                                    const std::shared_ptr<MemoryRegion>& region, uint64_t offset,
                                    uint64_t length, const StagingOptions& options) {
  if (!conn) throw Error(ErrorKind::kInvalidArgument, "staging: no endpoint");
  const std::optional<Announcement> a = conn->protocol().announcement(msg_id);
  if (a && a->eager) {  // its bytes are in host memory already: copied up from a slab
    return post_recv(conn, msg_id, reinterpret_cast<uint64_t>(region->addr()) + offset, length,
                     options);
  }
  RequestPtr request = conn->post_recv(msg_id, region, offset, length);
  messages_direct_.fetch_add(1, std::memory_order_relaxed);
  return request;
}

RequestPtr Stager::start(std::unique_ptr<Op> op) {
  if (!op->conn) throw Error(ErrorKind::kInvalidArgument, "staging: no endpoint");
  if (op->conn->is_closed()) {
    throw Error(ErrorKind::kClosed, "staging: the endpoint is closed: " + op->conn->error());
  }
  StagingOptions& o = op->options;
  if (o.slots == 0) o.slots = StagingOptions::kDefaultSlots;
  if (o.slots < 1 || o.slots > StagingOptions::kMaxSlots) {
    throw Error(ErrorKind::kInvalidArgument,
                "staging: slots=" + std::to_string(o.slots) + " must be in 1.." +
                    std::to_string(StagingOptions::kMaxSlots) + " bounce buffers");
  }
  if (!(o.timeout_s >= 0)) {
    throw Error(ErrorKind::kInvalidArgument, "staging: timeout must be >= 0 seconds");
  }
  static const OpKind kKinds[] = {OpKind::kWrite, OpKind::kRead, OpKind::kSend, OpKind::kRecv};
  op->request = std::make_shared<Request>(transport_.next_request_id(),
                                          kKinds[static_cast<int>(op->kind)], op->length);
  RequestPtr request = op->request;
  std::shared_ptr<Op> shared(std::move(op));
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw Error(ErrorKind::kClosed, "staging: the engine is closed");
  if (shared->kind == Op::Kind::kSend) {
    // Announced now, under the lock: messages keep the order they were posted in.
    const uint64_t c = std::min(o.chunk != 0 ? o.chunk : StagingOptions::kDefaultChunk,
                                transport_.domain().bounce_pool().slab_bytes());
    shared->windows = shared->conn->protocol().post_send_windows(
        shared->length, shared->meta, std::max<uint64_t>(1, c), static_cast<uint32_t>(o.slots),
        o.wire);
  }
  queue_.push_back(std::move(shared));
  // A worker per queued operation that no idle worker will take, up to kMaxWorkers.
  if (static_cast<size_t>(idle_) < queue_.size() &&
      static_cast<int>(workers_.size()) < kMaxWorkers) {
    workers_.emplace_back([this] { work(); });
  }
  queued_.notify_one();
  return request;
}

// A worker: runs queued operations one after the other until close(). It counts as idle again
// before it ends an operation's request, so a caller that posts the next operation as soon as
// the last one ended finds it free.
void Stager::work() {
  std::unique_lock<std::mutex> lock(mu_);
  ++idle_;
  for (;;) {
    queued_.wait(lock, [this] { return closed_ || !queue_.empty(); });
    if (closed_) {
      --idle_;
      return;
    }
    std::shared_ptr<Op> op = std::move(queue_.front());
    queue_.pop_front();
    --idle_;
    ++active_;
    lock.unlock();
    const std::function<void()> end = run(*op);
    lock.lock();
    --active_;
    ++idle_;
    lock.unlock();
    end();
    op.reset();
    lock.lock();
  }
}

void Stager::close() {
  std::deque<std::shared_ptr<Op>> queued;
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    closing_.store(true);
    queued.swap(queue_);
    workers.swap(workers_);
  }
  queued_.notify_all();
  for (const auto& op : queued) {
    // A send was announced when posted: its receiver would wait for windows that never come.
    if (op->windows) op->conn->abort(ErrorKind::kClosed, "the engine was closed mid-message");
    op->request->fail(ErrorKind::kClosed, "staging: the engine was closed before it started");
  }
  // Every operation in flight ends within one wait slice (and at once when its endpoint is
  // closed); its slabs go back to the domain's pool.
  for (std::thread& w : workers) {
    if (w.joinable()) w.join();
  }
}

int Stager::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

StagerStats Stager::stats() const {
  StagerStats s;
  s.messages_direct = messages_direct_.load(std::memory_order_relaxed);
  s.messages_whole = messages_whole_.load(std::memory_order_relaxed);
  s.messages_windowed = messages_windowed_.load(std::memory_order_relaxed);
  s.overlapped_copies = overlapped_copies_.load(std::memory_order_relaxed);
  return s;
}

int Stager::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(workers_.size());
}

}  // namespace rdmaxfer

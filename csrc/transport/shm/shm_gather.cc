// ShmChannel's gathered WRITEs and READs (transport/gather.h): a batch's group of small
// operations as one record listing its pieces (tcp/wire.h: kShmPieceBytes each), copied by the
// target with one process_vm_readv (WRITEs: pulled from the initiator) or process_vm_writev
// (READs: pushed into it) per IOV_MAX pieces, and answered by one WRITE_GATHER_ACK. The thread
// that reads the record checks the pieces; one of the transport's gather workers copies them
// and answers, so that while one group is copied the next ones are read and copied on the
// other cores (a batch keeps a few groups in flight). Groups of one kind run together; any
// other record waits for them (wait_gathers), so it sees their bytes as if copied in order. The target
// checks each piece against its RegionTable on its own; a refused piece, or one whose copy
// failed, fails alone. Device memory (CUDA IPC) is never gathered: the batch posts it one
// operation at a time. The rest of the channel is in shm_channel.cc.
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "common/error.h"
#include "transport/shm/cma_copy.h"
#include "transport/shm/shm_channel.h"
#include "transport/shm/shm_transport.h"

namespace rdmaxfer {

namespace {
// Two full iovec lists per group: few records and system calls per byte (a batch keeps a few
// groups in flight: protocol/batch.h).
constexpr size_t kShmGatherPieces = 2048;
// Larger pieces go alone (a copy of several MiB is split over threads: cma_copy.h).
constexpr uint64_t kShmGatherPieceBytes = 1ull << 20;
// A group's copy holds back the records after it: bounded so that they wait little.
constexpr uint64_t kShmGatherBytes = 16ull << 20;
// The status byte of a piece the target accepted but could not copy (aux: the errno).
constexpr uint8_t kCopyFailed = 0xff;

GatherLimits host_limits(const MemoryRegion& local) {
  if (ipc_device_region(&local) != nullptr) return GatherLimits{};
  return GatherLimits{kShmGatherPieces, kShmGatherPieceBytes, kShmGatherBytes};
}
}  // namespace

struct ShmChannel::GatherWork {
  GatherWork(std::shared_ptr<ShmChannel> owner, const FrameHeader& h, std::string piece_statuses,
             std::vector<RegionUse> regions, std::vector<CmaPiece> host_copies,
             std::vector<size_t> copy_index, int first_error, uint64_t moved_bytes)
      : channel(std::move(owner)),
        header(h),
        statuses(std::move(piece_statuses)),
        holds(std::move(regions)),
        copies(std::move(host_copies)),
        index(std::move(copy_index)),
        error(first_error),
        moved(moved_bytes) {
    std::lock_guard<std::mutex> lock(channel->gather_mu_);
    ++channel->gathers_running_;
    channel->gathers_type_ = header.type;
  }
  // Counted in from here (shm_channel.h: gathers_running_) until done or dropped (a stopped
  // worker queue): meanwhile records of another kind wait for it.
  ~GatherWork() {
    {
      std::lock_guard<std::mutex> lock(channel->gather_mu_);
      --channel->gathers_running_;
    }
    channel->gather_cv_.notify_all();
  }
  GatherWork(const GatherWork&) = delete;
  GatherWork& operator=(const GatherWork&) = delete;

  std::shared_ptr<ShmChannel> channel;
  FrameHeader header;
  std::string statuses;         // per piece: 0, an AccessStatus, or kCopyFailed
  std::vector<RegionUse> holds;  // the target regions, held until the bytes are in place
  std::vector<CmaPiece> copies;  // the accepted pieces of host memory
  std::vector<size_t> index;     // the piece each copy is
  int error;                     // the first failed copy's errno
  uint64_t moved;                // bytes placed so far (device pieces, copied in place)
};

GatherWrites::Limits ShmChannel::gather_limits(const MemoryRegion& local) const {
  return host_limits(local);
}

GatherLimits ShmChannel::read_gather_limits(const MemoryRegion& local) const {
  return host_limits(local);
}

RequestPtr ShmChannel::post_write_gather(const std::shared_ptr<MemoryRegion>& local,
                                         const std::vector<GatherPiece>& pieces,
                                         PieceFailed failed) {
  return post_gather(FrameType::kWriteGather, local, pieces, std::move(failed));
}

RequestPtr ShmChannel::post_read_gather(const std::shared_ptr<MemoryRegion>& local,
                                        const std::vector<GatherPiece>& pieces,
                                        PieceFailed failed) {
  return post_gather(FrameType::kReadGather, local, pieces, std::move(failed));
}

RequestPtr ShmChannel::post_gather(FrameType type, const std::shared_ptr<MemoryRegion>& local,
                                   const std::vector<GatherPiece>& pieces, PieceFailed failed) {
  const bool write = type == FrameType::kWriteGather;
  if (pieces.empty() || pieces.size() > kShmGatherPieces || ipc_device_region(local.get())) {
    throw Error(ErrorKind::kInvalidArgument,
                "shm: a gathered group holds 1.." + std::to_string(kShmGatherPieces) +
                    " pieces of host memory, not " + std::to_string(pieces.size()));
  }
  check_open();
  std::string list(pieces.size() * kShmPieceBytes, '\0');
  auto* m = reinterpret_cast<uint8_t*>(list.data());
  uint64_t bytes = 0;
  for (const GatherPiece& p : pieces) {
    store_le<uint64_t>(m, p.remote.addr + p.remote_offset);
    store_le<uint64_t>(m + 8, p.length);
    store_le<uint32_t>(m + 16, p.remote.key);
    store_le<uint64_t>(m + 24, reinterpret_cast<uint64_t>(local->addr() + p.local_offset));
    m += kShmPieceBytes;
    bytes += p.length;
  }
  RequestPtr req = new_request(write ? OpKind::kWrite : OpKind::kRead, bytes);
  count_when_terminal(req, write ? "write" : "read");
  const uint64_t op = next_op_.fetch_add(1);
  track(op, Pending{req, RegionUse(local), type, false, std::move(failed), pieces.size()});
  FrameHeader h;
  h.type = type;
  h.req_id = op;
  h.aux = pieces.size();
  h.size = bytes;
  h.total = bytes;
  h.payload_len = list.size();
  try {
    push(h, std::string(), reinterpret_cast<const uint8_t*>(list.data()), list.size());
  } catch (const Error& e) {
    abort(e.kind(), "connection to " + peer_ + " failed: " + e.what());
  }
  return req;
}

void ShmChannel::serve_gather(const FrameHeader& h, const std::string& record) {
  const bool write = h.type == FrameType::kWriteGather;
  const uint64_t n = h.aux;
  if (n == 0 || n > kShmGatherPieces || h.payload_len != n * kShmPieceBytes || h.meta_len != 0) {
    throw Error(ErrorKind::kProtocol, "shm gather record does not list its pieces");
  }
  const auto* m = reinterpret_cast<const uint8_t*>(record.data()) + FrameHeader::kSize;
  std::string statuses(n, '\0');
  // The regions the pieces are in, each held once: a piece in the region of the one before
  // it (the common case) is checked against that region's bounds, without a table look-up.
  std::vector<RegionUse> holds;
  uint32_t held_key = 0;
  std::vector<CmaPiece> copies;  // host memory: copied together
  std::vector<size_t> index;     // the piece each copy is
  copies.reserve(n);
  index.reserve(n);
  int error = 0;  // the first failed copy's errno
  uint64_t moved = 0;
  for (size_t i = 0; i < n; ++i, m += kShmPieceBytes) {
    const uint64_t addr = load_le<uint64_t>(m);
    const uint64_t len = load_le<uint64_t>(m + 8);
    const uint32_t key = load_le<uint32_t>(m + 16);
    const uint64_t from = load_le<uint64_t>(m + 24);
    AccessStatus st = AccessStatus::kOk;
    if (!holds.empty() && key == held_key) {
      if (!holds.back().get()->contains(addr, len)) st = AccessStatus::kOutOfBounds;
    } else {
      RegionUse use;
      st = transport_.domain().regions().acquire(
          key, addr, len, write ? kAccessRemoteWrite : kAccessRemoteRead, &use);
      if (st == AccessStatus::kOk) {
        holds.push_back(std::move(use));
        held_key = key;
      }
    }
    statuses[i] = static_cast<char>(st);
    if (st != AccessStatus::kOk) continue;
    MemoryRegion& region = *holds.back().get();
    auto* target = reinterpret_cast<uint8_t*>(addr);
    if (ipc_device_region(&region) != nullptr) {
      int err = EIO;  // device memory here: copied on its own (cma_device_copy)
      try {
        err = move(region, std::string(), write, target, from, len);
      } catch (const Error&) {
      }
      if (err != 0) {
        statuses[i] = static_cast<char>(kCopyFailed);
        if (error == 0) error = err;
      } else {
        moved += len;
      }
      continue;
    }
    copies.push_back(CmaPiece{target, from, len});
    index.push_back(i);
  }
  auto work = std::make_shared<GatherWork>(shared_from_this(), h, std::move(statuses),
                                           std::move(holds), std::move(copies),
                                           std::move(index), error, moved);
  if (!transport_.gather_workers().submit([work] { work->channel->finish_gather(*work); })) {
    finish_gather(*work);
  }
}

void ShmChannel::wait_gathers(FrameType type) {
  const bool group = type == FrameType::kWriteGather || type == FrameType::kReadGather;
  std::unique_lock<std::mutex> lock(gather_mu_);
  // In slices, so that a close (which fails what the workers still hold) ends the wait.
  while (gathers_running_ > 0 && !(group && type == gathers_type_) && !is_closed()) {
    gather_cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

void ShmChannel::finish_gather(GatherWork& work) {
  const bool write = work.header.type == FrameType::kWriteGather;
  std::vector<int> errors;
  cma_copy_pieces(peer_pid_, write ? CmaDirection::kPull : CmaDirection::kPush, work.copies,
                  &errors);
  for (size_t k = 0; k < work.copies.size(); ++k) {
    if (errors[k] == 0) {
      work.moved += work.copies[k].length;
      continue;
    }
    work.statuses[work.index[k]] = static_cast<char>(kCopyFailed);
    if (work.error == 0) work.error = errors[k];
  }
  work.holds.clear();  // the bytes are in place
  stats_->add_lane(0, work.moved);
  const bool all = work.statuses.find_first_not_of('\0') == std::string::npos;
  FrameHeader ack;
  ack.type = FrameType::kWriteGatherAck;
  ack.req_id = work.header.req_id;
  ack.size = work.header.size;
  ack.status = all ? 0 : 1;
  ack.aux = static_cast<uint64_t>(work.error);
  ack.meta_len = all ? 0 : static_cast<uint32_t>(work.statuses.size());
  try {
    push(ack, all ? std::string() : work.statuses, nullptr, 0);
  } catch (const Error& e) {
    abort(e.kind(), "connection to " + peer_ + " failed: " + e.what());
  }
}

void ShmChannel::on_gather_ack(const FrameHeader& h, const std::string& meta) {
  Pending p;
  if (!take_pending(h.req_id, &p)) return;  // failed by a close that raced with the answer
  if (p.pieces == 0 || (h.status != 0 && meta.size() != p.pieces)) {
    throw Error(ErrorKind::kProtocol, "shm: a gather acknowledgement that does not match");
  }
  const bool write = p.type == FrameType::kWriteGather;
  if (h.status != 0) {
    for (size_t i = 0; i < p.pieces; ++i) {
      const auto st = static_cast<uint8_t>(meta[i]);
      if (st == 0) continue;
      if (st == kCopyFailed) {
        p.failed(i, Error(ErrorKind::kTransport,
                          cma_failure(write ? "process_vm_readv" : "process_vm_writev",
                                      static_cast<int>(h.aux), peer_)));
        continue;
      }
      p.failed(i, Error(ErrorKind::kRemoteAccess,
                        "peer " + peer_ + " refused access to piece " + std::to_string(i) +
                            " of a gathered " + (write ? "WRITE" : "READ") + ": " +
                            access_status_text(static_cast<AccessStatus>(st)) +
                            " (check the descriptor, remote_offset and length)"));
    }
  }
  p.request->complete();
}

}  // namespace rdmaxfer

// RdmaConnection's gathered WRITEs and READs (transport/gather.h): a batch's group of small
// WRITEs (READs) as one request whose WRs go on one QP together, so the send queue chains them
// into few ibv_post_send calls and signals few of them (send_queue.h). READs beyond the QP's
// max_rd_atomic wait in the send queue of the device, as any READ does. Set-up, completions and
// teardown are in rdma_connection.cc and rdma_completions.cc, single transfers in
// rdma_striping.cc.
#include <algorithm>

#include "common/error.h"
#include "transport/rdma/rdma_connection.h"

namespace rdmaxfer {

namespace {
// Pieces per group: a quarter of the default send queue (256), so a batch window keeps
// several groups in flight.
constexpr size_t kRdmaGatherPieces = 64;
// Pieces above this are posted one by one (chunked and striped like any WRITE or READ).
constexpr uint64_t kRdmaGatherPieceBytes = 64 * 1024;
}  // namespace

GatherWrites::Limits RdmaConnection::gather_limits(const MemoryRegion& /*local*/) const {
  const uint64_t piece = std::min<uint64_t>(kRdmaGatherPieceBytes, max_chunk());
  return Limits{kRdmaGatherPieces, piece, piece * kRdmaGatherPieces};
}

GatherLimits RdmaConnection::read_gather_limits(const MemoryRegion& local) const {
  return gather_limits(local);
}

RequestPtr RdmaConnection::post_write_gather(const std::shared_ptr<MemoryRegion>& local,
                                             const std::vector<GatherPiece>& pieces,
                                             PieceFailed failed) {
  return post_gather(OpKind::kWrite, local, pieces, std::move(failed));
}

RequestPtr RdmaConnection::post_read_gather(const std::shared_ptr<MemoryRegion>& local,
                                            const std::vector<GatherPiece>& pieces,
                                            PieceFailed failed) {
  return post_gather(OpKind::kRead, local, pieces, std::move(failed));
}

RequestPtr RdmaConnection::post_gather(OpKind op, const std::shared_ptr<MemoryRegion>& local,
                                       const std::vector<GatherPiece>& pieces,
                                       PieceFailed failed) {
  const bool write = op == OpKind::kWrite;
  const std::string what = write ? "WRITE" : "READ";
  if (pieces.empty() || pieces.size() > kRdmaGatherPieces) {
    throw Error(ErrorKind::kInvalidArgument,
                "a gathered " + what + " holds 1.." + std::to_string(kRdmaGatherPieces) +
                    " pieces, not " + std::to_string(pieces.size()));
  }
  // The rkeys of each distinct descriptor (neighbouring pieces usually share one).
  std::vector<std::shared_ptr<const std::vector<uint32_t>>> keys_of(pieces.size());
  uint64_t bytes = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const GatherPiece& p = pieces[i];
    check_local_range(local, p.local_offset, p.length, what.c_str(),
                      write ? LocalUse::kSource : LocalUse::kDestination);
    check_remote(p.remote, p.remote_offset, p.length, what.c_str());
    if (p.length > kRdmaGatherPieceBytes || p.length > max_chunk()) {
      throw Error(ErrorKind::kInvalidArgument,
                  "a gathered " + what + " piece of " + std::to_string(p.length) +
                      " bytes is over the limit; post it as its own " + what);
    }
    bytes += p.length;
    if (i > 0 && p.remote.key == pieces[i - 1].remote.key &&
        p.remote.rail_keys == pieces[i - 1].remote.rail_keys &&
        p.remote.generation == pieces[i - 1].remote.generation) {
      keys_of[i] = keys_of[i - 1];
      continue;
    }
    keys_of[i] = remote_keys(p.remote);
  }
  // One QP that reaches every piece's region: on the local region's home rail when it can,
  // else the least loaded.
  std::vector<int> usable = usable_lanes(keys_of[0].get(), -1, local.get());
  usable.erase(std::remove_if(usable.begin(), usable.end(),
                              [&](int l) {
                                const size_t peer = static_cast<size_t>(
                                    lanes_[static_cast<size_t>(l)].peer_rail);
                                return std::any_of(keys_of.begin(), keys_of.end(),
                                                   [peer](const auto& k) {
                                                     return peer >= k->size() || (*k)[peer] == 0;
                                                   });
                              }),
               usable.end());
  if (usable.empty()) {
    throw Error(ErrorKind::kConnection,
                "endpoint to " + peer() + ": no live rail reaches every remote region of the "
                "group (a descriptor has no key on the peer's remaining rails); connect again");
  }
  const auto* region = dynamic_cast<const RdmaRegion*>(local.get());
  std::vector<int> home;
  for (int l : usable) {
    if (region != nullptr && lanes_[static_cast<size_t>(l)].rail == region->home_rail()) {
      home.push_back(l);
    }
  }
  const int lane = least_loaded(home.empty() ? usable : home);
  const Lane& l = lanes_[static_cast<size_t>(lane)];
  const uint32_t lkey =
      region != nullptr ? region->lkey_on(static_cast<size_t>(l.rail)) : local->lkey();
  const size_t peer_rail = static_cast<size_t>(l.peer_rail);

  auto req = new_request(op, bytes);
  count_when_terminal(req, write ? "write" : "read");
  req->set_parts(pieces.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    active_[req->id()] = req;
    gathers_[req->id()] = PendingGather{std::move(failed), static_cast<uint32_t>(pieces.size())};
  }
  std::vector<SendWork> works(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const GatherPiece& p = pieces[i];
    SendWork& w = works[i];
    w.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    w.local_addr = reinterpret_cast<uint64_t>(local->addr() + p.local_offset);
    w.length = static_cast<uint32_t>(p.length);
    w.lkey = lkey;
    w.remote_addr = p.remote.addr + p.remote_offset;
    w.rkey = (*keys_of[i])[peer_rail];
    w.request = req;
    w.piece = static_cast<uint32_t>(i);
    w.hold = RegionUse(local);
    w.remote_keys = keys_of[i];
  }
  works.back().last = true;
  submit(lane, std::move(works));
  return req;
}

std::function<void()> RdmaConnection::settle_gather(const RequestPtr& request, uint32_t piece,
                                                    const Error& own, const Error& why) {
  if (!request) return nullptr;
  PendingGather group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = gathers_.find(request->id());
    if (it == gathers_.end()) return nullptr;
    group = std::move(it->second);
    gathers_.erase(it);
    active_.erase(request->id());
  }
  return [request, piece, own, why, group = std::move(group)] {
    // RC completes a send queue in order: the pieces before `piece` landed.
    group.failed(piece, own);
    for (uint32_t i = piece + 1; i < group.pieces; ++i) group.failed(i, why);
    request->complete();
  };
}

}  // namespace rdmaxfer

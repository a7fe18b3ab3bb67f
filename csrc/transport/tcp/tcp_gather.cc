// TcpConnection's gathered WRITEs and READs (transport/gather.h): a batch's group of small
// operations as one frame each way. WRITE_GATHER carries every piece's bytes after its list
// and is answered by one WRITE_GATHER_ACK; READ_GATHER carries the list alone and is answered
// by one READ_GATHER_RESP holding the bytes of every piece the target accepted, which the
// initiator reads in place into its pieces (tcp_stream.h: RecvSink::scatter). The target
// checks each piece on its own. Single transfers and the rest of the connection are in
// tcp_connection.cc.
#include "common/bytes.h"
#include "common/error.h"
#include "transport/tcp/tcp_connection.h"

namespace rdmaxfer {

namespace {
// A group: enough small operations that their frame and acknowledgement cost little per
// byte, few enough that a batch's window holds several groups in flight.
constexpr size_t kTcpGatherPieces = 64;
constexpr uint64_t kTcpGatherPieceBytes = 64 * 1024;
constexpr uint64_t kTcpGatherBytes = 512 * 1024;

// The pieces' list (kGatherPieceMeta bytes each: target address, length, key) and their
// bytes; `into`: the local pieces, in order.
std::string piece_list(const MemoryRegion& local, const std::vector<GatherPiece>& pieces,
                       std::vector<std::pair<uint8_t*, uint64_t>>* into, uint64_t* bytes) {
  std::string meta(pieces.size() * kGatherPieceMeta, '\0');
  into->reserve(pieces.size());
  *bytes = 0;
  auto* m = reinterpret_cast<uint8_t*>(meta.data());
  for (const GatherPiece& p : pieces) {
    store_le<uint64_t>(m, p.remote.addr + p.remote_offset);
    store_le<uint64_t>(m + 8, p.length);
    store_le<uint32_t>(m + 16, p.remote.key);
    m += kGatherPieceMeta;
    into->emplace_back(local.addr() + p.local_offset, p.length);
    *bytes += p.length;
  }
  return meta;
}
}  // namespace

GatherWrites::Limits TcpConnection::gather_limits(const MemoryRegion& /*local*/) const {
  return Limits{kTcpGatherPieces, kTcpGatherPieceBytes, kTcpGatherBytes};
}

GatherLimits TcpConnection::read_gather_limits(const MemoryRegion& /*local*/) const {
  return GatherLimits{kTcpGatherPieces, kTcpGatherPieceBytes, kTcpGatherBytes};
}

RequestPtr TcpConnection::post_write_gather(const std::shared_ptr<MemoryRegion>& local,
                                            const std::vector<GatherPiece>& pieces,
                                            PieceFailed failed) {
  return post_gather(FrameType::kWriteGather, local, pieces, std::move(failed));
}

RequestPtr TcpConnection::post_read_gather(const std::shared_ptr<MemoryRegion>& local,
                                           const std::vector<GatherPiece>& pieces,
                                           PieceFailed failed) {
  return post_gather(FrameType::kReadGather, local, pieces, std::move(failed));
}

RequestPtr TcpConnection::post_gather(FrameType type, const std::shared_ptr<MemoryRegion>& local,
                                      const std::vector<GatherPiece>& pieces,
                                      PieceFailed failed) {
  const bool write = type == FrameType::kWriteGather;
  check_cpu_addressable(*local, write ? "WRITE" : "READ");
  std::vector<std::pair<uint8_t*, uint64_t>> at;
  uint64_t bytes = 0;
  std::string meta = piece_list(*local, pieces, &at, &bytes);
  auto req = std::make_shared<Request>(transport_.next_request_id(),
                                       write ? OpKind::kWrite : OpKind::kRead, bytes);
  count_when_terminal(req, write ? "write" : "read");
  FrameHeader h;
  h.type = type;
  h.req_id = req->id();
  h.aux = pieces.size();
  h.size = bytes;
  h.total = bytes;
  h.payload_len = write ? bytes : 0;  // a WRITE's pieces follow their list
  OutFrame f = make_frame(h, std::move(meta));
  if (write) {
    f.gather.assign(at.begin(), at.end());
    f.data_len = bytes;
    f.hold = RegionUse(local);
    f.progress = req;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    gathers_[req->id()] = write ? PendingGather{req, std::move(failed), pieces.size(), {}, nullptr}
                                : PendingGather{req, std::move(failed), pieces.size(),
                                                std::move(at), local};
  }
  send_on(least_loaded(streams()), std::move(f));
  return req;
}

void TcpConnection::check_pieces(const FrameHeader& h, const std::string& meta, uint32_t access,
                                 uint64_t bytes, CheckedPieces* out) const {
  auto protocol = [&](const std::string& what) {
    throw Error(ErrorKind::kProtocol,
                std::string(frame_type_name(h.type)) + " frame from " + peer_ + ": " + what);
  };
  const uint64_t n = h.aux;
  if (n == 0 || meta.size() != n * kGatherPieceMeta) protocol("metadata does not list its pieces");
  out->pieces.reserve(n);
  out->holds.reserve(n);
  out->statuses.assign(n, '\0');
  const auto* m = reinterpret_cast<const uint8_t*>(meta.data());
  uint64_t total = 0;
  for (uint64_t i = 0; i < n; ++i, m += kGatherPieceMeta) {
    const uint64_t addr = load_le<uint64_t>(m);
    const uint64_t len = load_le<uint64_t>(m + 8);
    if (len > bytes - total) protocol("pieces longer than the data");
    total += len;
    RegionUse use;
    const AccessStatus st = transport_.domain().regions().acquire(load_le<uint32_t>(m + 16), addr,
                                                                  len, access, &use,
                                                                  /*by_cpu=*/true);
    out->statuses[i] = static_cast<char>(st);
    if (st == AccessStatus::kOk) {
      out->pieces.emplace_back(reinterpret_cast<uint8_t*>(addr), len);
      out->holds.push_back(std::move(use));
    } else {
      out->pieces.emplace_back(nullptr, len);
    }
  }
  if (total != bytes) protocol("pieces shorter than the data");
}

void TcpConnection::choose_scatter(const FrameHeader& h, const std::string& meta,
                                   RecvSink* sink) const {
  CheckedPieces checked;
  check_pieces(h, meta, kAccessRemoteWrite, h.payload_len, &checked);
  sink->scatter = std::move(checked.pieces);
  sink->holds = std::move(checked.holds);
  sink->statuses = std::move(checked.statuses);
}

void TcpConnection::serve_read_gather(TcpStream& stream, const FrameHeader& h,
                                      const std::string& meta) {
  CheckedPieces checked;
  check_pieces(h, meta, kAccessRemoteRead, h.size, &checked);
  FrameHeader resp;
  resp.type = FrameType::kReadGatherResp;
  resp.req_id = h.req_id;
  resp.size = h.size;
  const bool all = checked.statuses.find_first_not_of('\0') == std::string::npos;
  resp.status = all ? 0 : 1;
  std::vector<std::pair<const uint8_t*, uint64_t>> from;
  from.reserve(checked.pieces.size());
  uint64_t bytes = 0;
  for (const auto& [base, len] : checked.pieces) {
    if (base == nullptr) continue;  // refused: no bytes for it
    from.emplace_back(base, len);
    bytes += len;
  }
  resp.payload_len = bytes;
  OutFrame f = make_frame(resp, all ? std::string() : std::move(checked.statuses));
  f.gather = std::move(from);
  f.data_len = bytes;
  f.holds = std::move(checked.holds);
  send_on(stream, std::move(f));
}

void TcpConnection::choose_read_scatter(const FrameHeader& h, const std::string& meta,
                                        RecvSink* sink) {
  auto protocol = [&](const std::string& what) {
    throw Error(ErrorKind::kProtocol, "READ_GATHER_RESP frame from " + peer_ + ": " + what);
  };
  std::lock_guard<std::mutex> lock(mu_);
  auto it = gathers_.find(h.req_id);
  if (it == gathers_.end()) {
    sink->discard = true;  // the READs were aborted meanwhile
    return;
  }
  const PendingGather& g = it->second;
  if (g.region == nullptr) protocol("an answer to WRITEs");
  if (h.status != 0 && meta.size() != g.pieces) protocol("statuses do not match the pieces");
  sink->scatter.reserve(g.pieces);
  uint64_t bytes = 0;
  for (size_t i = 0; i < g.pieces; ++i) {
    if (h.status != 0 && meta[i] != '\0') continue;  // refused: the target sent no bytes
    sink->scatter.push_back(g.into[i]);
    bytes += g.into[i].second;
  }
  if (bytes != h.payload_len) protocol("data differs from the pieces accepted");
  sink->hold = RegionUse(g.region);
  sink->progress = g.request;
}

void TcpConnection::on_gather_ack(TcpStream& stream, const FrameHeader& h,
                                  const std::string& meta) {
  PendingGather g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = gathers_.find(h.req_id);
    if (it == gathers_.end()) return;  // aborted meanwhile
    if (h.status != 0 && meta.size() != it->second.pieces) {
      throw Error(ErrorKind::kProtocol, std::string(frame_type_name(h.type)) + " frame from " +
                                            peer_ + ": statuses do not match the pieces");
    }
    g = std::move(it->second);
    gathers_.erase(it);
  }
  const char* what = g.region == nullptr ? "WRITE" : "READ";
  if (h.status != 0) {
    for (size_t i = 0; i < g.pieces; ++i) {
      const auto st = static_cast<AccessStatus>(static_cast<uint8_t>(meta[i]));
      if (st == AccessStatus::kOk) continue;
      g.failed(i, Error(ErrorKind::kRemoteAccess,
                        "peer " + peer_ + " refused access to piece " + std::to_string(i) +
                            " of a gathered " + what + ": " + access_status_text(st) +
                            " (check the descriptor, remote_offset and length)"));
    }
  }
  stats_->add_lane(stream.index(), h.size);
  g.request->complete();
}

}  // namespace rdmaxfer

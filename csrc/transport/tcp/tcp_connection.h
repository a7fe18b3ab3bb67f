// A connection to one peer over one or more TCP streams (see wire.h for the frames).
//
// Lifecycle: open (streams in their IoLoops; operations may be posted) -> closed, by close()
// (GOODBYE sent), by the peer (GOODBYE or EOF) or by abort() after an error or a timeout. On
// closing every pending request fails with the reason, every stream is killed, and the memory
// the streams were using is released once their loops have let go of it. A closed connection
// refuses new operations with an EndpointClosed error; the transport keeps working.
//
// One-sided WRITE/READ are served here, on the loop thread, against the transport's
// RegionTable: an access outside a registered region is refused and changes nothing.
// The protocol's primitives (channel.h): control messages are MSG_* frames on stream 0; a
// grant is an entry of this connection's grant table, named by its key, and a
// post_write_notify is MSG_DATA chunks into it over the streams; the last byte to land fires
// on_notify. A chunk outside its grant, or for no grant, is a protocol error that closes the
// connection. Gathered WRITEs (transport/gather.h) are one WRITE_GATHER frame per group.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/poll_mode.h"
#include "transport/closed_state.h"
#include "transport/gather.h"
#include "transport/grant_table.h"
#include "transport/tcp/tcp_stream.h"
#include "transport/transport.h"

namespace rdmaxfer {

// The TCP transport's id in descriptors and hellos (core/transport_ids.h).
constexpr uint8_t kTcpWireId = 1;

struct TcpConfig {
  int io_threads = 0;             // 0: min(2, cores)
  int socket_buffer = 0;          // SO_SNDBUF/SO_RCVBUF bytes; 0 keeps kernel autotuning
  int default_streams = 0;        // streams per connection; 0: 4
  uint64_t eager_limit = 16384;   // messages up to this size travel with their header
  std::string secret;             // shared secret for the bootstrap (transport/auth.h)
  PollMode poll_mode = PollMode::kAdaptive;  // how waits spend their time (core/poll_mode.h)
  bool tls = false;               // TLS 1.3 on every stream (transport/tls.h)
  TlsSettings tls_settings;       // its secret (the PSK) or PEM files
};

class TcpConnection : public Channel,
                      public GatherWrites,
                      public GatherReads,
                      public std::enable_shared_from_this<TcpConnection> {
 public:
  // `peer_engine`: the peer's engine id; a one-sided request with a descriptor of another
  // engine, or of another transport, is refused before anything is sent.
  TcpConnection(Transport& transport, const TcpConfig& config, std::string peer,
                uint64_t peer_engine);
  // Creates the streams and adds them to the loops (one fd per stream, in index order, with
  // its TLS session when TLS is on: `tls` empty or as long as `fds`).
  void start(std::vector<UniqueFd> fds, std::vector<std::unique_ptr<TlsSession>> tls,
             const std::vector<IoLoop*>& loops);

  RequestPtr post_write(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                        const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                        const TransferOptions& options) override;
  RequestPtr post_read(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                       const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                       const TransferOptions& options) override;
  // Gathered WRITEs and READs: at most 64 pieces of at most 64 KiB each (tcp_gather.cc).
  Limits gather_limits(const MemoryRegion& local) const override;
  RequestPtr post_write_gather(const std::shared_ptr<MemoryRegion>& local,
                               const std::vector<GatherPiece>& pieces,
                               PieceFailed failed) override;
  GatherLimits read_gather_limits(const MemoryRegion& local) const override;
  RequestPtr post_read_gather(const std::shared_ptr<MemoryRegion>& local,
                              const std::vector<GatherPiece>& pieces,
                              PieceFailed failed) override;
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
  int streams() const override { return static_cast<int>(streams_.size()); }

  // Called by streams on their loop thread.
  void choose_sink(TcpStream& stream, const FrameHeader& header, const std::string& meta,
                   RecvSink* sink);
  void on_frame(TcpStream& stream, const FrameHeader& header, std::string meta, RecvSink sink);

 private:
  struct PendingRead {
    RequestPtr request;
    std::shared_ptr<MemoryRegion> region;
    uint8_t* base = nullptr;
    uint64_t length = 0;
  };

  // A gathered group in flight (WRITEs, or READs landing in `into` of `region`).
  struct PendingGather {
    RequestPtr request;
    PieceFailed failed;
    size_t pieces = 0;
    std::vector<std::pair<uint8_t*, uint64_t>> into;
    std::shared_ptr<MemoryRegion> region;  // null for WRITEs
  };
  // A gathered frame's pieces as the target checked them: address (null when refused) and
  // length, one AccessStatus byte each, and the regions of those accepted.
  struct CheckedPieces {
    std::vector<std::pair<uint8_t*, uint64_t>> pieces;
    std::string statuses;
    std::vector<RegionUse> holds;
  };

  // TCP copies with the CPU, which cannot address GPU memory registered for CUDA IPC (an
  // automatic engine's, moved directly on its shm connections only): throws
  // Error(kInvalidArgument) for such a local region.
  static void check_cpu_addressable(const MemoryRegion& local, const char* what);
  // Posts a WRITE_GATHER or READ_GATHER of `pieces` of `local`.
  RequestPtr post_gather(FrameType type, const std::shared_ptr<MemoryRegion>& local,
                         const std::vector<GatherPiece>& pieces, PieceFailed failed);
  // Checks each piece listed in a WRITE_GATHER / READ_GATHER (`bytes` in all) for `access`.
  void check_pieces(const FrameHeader& h, const std::string& meta, uint32_t access,
                    uint64_t bytes, CheckedPieces* out) const;
  // The destinations of a WRITE_GATHER's pieces, each checked on its own.
  void choose_scatter(const FrameHeader& h, const std::string& meta, RecvSink* sink) const;
  // Answers a READ_GATHER with the bytes of the pieces it may read.
  void serve_read_gather(TcpStream& stream, const FrameHeader& h, const std::string& meta);
  // The local pieces a READ_GATHER_RESP's bytes land in.
  void choose_read_scatter(const FrameHeader& h, const std::string& meta, RecvSink* sink);
  // A WRITE_GATHER_ACK or READ_GATHER_RESP (its bytes in place): completes the group.
  void on_gather_ack(TcpStream& stream, const FrameHeader& h, const std::string& meta);
  AccessStatus acquire_request_range(const FrameHeader& h, uint32_t access,
                                     RegionUse* use) const;
  // Closes the connection once: fails every pending request with (kind, reason), optionally
  // sends GOODBYE, and kills the streams; logs the cause at `level`.
  void shut(ErrorKind kind, const std::string& reason, bool goodbye, log::Level level);
  void check_open_locked() const;
  TcpStream& least_loaded(int among) const;
  void send_on(TcpStream& stream, OutFrame frame);

  Transport& transport_;
  const TcpConfig config_;
  const std::string peer_;
  const uint64_t peer_engine_;
  // Throws Error(kInvalidArgument) naming both when `remote` was not made by the peer's tcp
  // engine, then checks its range (check_remote_range).
  void check_remote(const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                    const char* what) const;
  std::vector<std::shared_ptr<TcpStream>> streams_;

  mutable std::mutex mu_;
  ClosedState state_;
  std::unordered_map<uint64_t, RequestPtr> writes_;
  std::unordered_map<uint64_t, PendingRead> reads_;
  std::unordered_map<uint64_t, PendingGather> gathers_;
  GrantTable grants_;  // destinations the peer writes one message into (MSG_DATA frames)
};

}  // namespace rdmaxfer

// One end of an shm connection (shm_transport.h): the peer is another process on this host.
//
// Control path: two ShmRings (one per direction, each in a memfd the consumer made and sent
// with SCM_RIGHTS), records framed like TCP's (tcp/wire.h: a FrameHeader, metadata, data).
// A reader thread spins on the inbound ring for its linger budget (the engine's poll mode,
// core/poll_mode.h: self-tuned, long or none), then sleeps on its eventfd and the UNIX
// socket together: after the handshake the socket carries only the fds of VMM allocations
// (below), kept as they come, so its end of file means the peer closed or died (the kernel
// closes it), and every request fails at once.
// A thread that waits for one of this channel's requests reads the inbound ring itself for a
// while first (drive(), the Progress of every request: spin on the ring for the transport's
// wait budget, then sleep on the request as before; not at all in event mode): the acknowledgement then reaches the waiter without waking the reader.
// While a waiter drives, and for a short hand-back time after (the next operation's waiter
// comes soon in a loop of blocking calls), the doorbell is not armed, so the peer does not
// ring it; the reader sleeps meanwhile, in bounded naps, and takes the ring back once no
// waiter came. One thread at a time takes records from the ring and handles them
// (consuming_), in ring order.
//
// A batch's groups of small WRITEs or READs (transport/gather.h) go as one WRITE_GATHER /
// READ_GATHER record listing every piece; the target checks each on its own and copies those
// it accepts with one process_vm_readv/writev per IOV_MAX pieces (shm_gather.cc), then answers
// one WRITE_GATHER_ACK naming the pieces refused or not copied.
// One-sided WRITE/READ and notified writes are copied by the side that owns the target memory
// (like TCP, the target checks every access against its RegionTable or grant): WRITE and
// MSG_DATA are pulled with process_vm_readv from the initiator, READ is pushed with
// process_vm_writev into it; then an acknowledgement completes the initiator's request.
// Device memory (registered on shm) moves by CUDA IPC instead: the record then names the
// initiator's range by its IPC handle, and the target copies on the GPU (shm/cuda_ipc.h).
// A VMM allocation's fd is sent once per connection on the socket (8 bytes, its id, with the
// fd as SCM_RIGHTS) before the first record naming it; the side that reads the socket (the
// reader, or the thread that needs the fd) keeps what arrives until the record's copy takes it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/deadline.h"
#include "common/unique_fd.h"
#include "core/poll_mode.h"
#include "core/request.h"
#include "transport/channel.h"
#include "transport/closed_state.h"
#include "transport/gather.h"
#include "transport/one_sided_channel.h"
#include "transport/grant_table.h"
#include "transport/shm/cuda_ipc.h"
#include "transport/shm/shm_ring.h"
#include "transport/wire.h"

namespace rdmaxfer {

class ShmTransport;

class ShmChannel : public OneSidedChannel,
                   public GatherWrites,
                   public GatherReads,
                   public Progress,
                   public std::enable_shared_from_this<ShmChannel> {
 public:
  static constexpr uint64_t kRingBytes = 8ull << 20;
  static constexpr uint64_t kEagerLimit = 64 * 1024;
  static constexpr uint64_t kCtrlRoom = kEagerLimit + 64 * 1024;
  static constexpr uint32_t kCreditWindow = 16;

  // Runs the shm set-up on `sock` (a UNIX stream socket past the Hello/auth handshake):
  // exchanges host identities (same_host.h), rings and doorbells, and probes CMA both ways.
  // Throws Error(kUnsupported) with the reason when the peer is not on this host or CMA is
  // refused, Error(kConnection/kTimeout) when the peer fails. The transport then attaches the
  // protocol and calls start_reader().
  static std::shared_ptr<ShmChannel> establish(ShmTransport& transport, UniqueFd sock,
                                               std::string peer, const Deadline& deadline);
  ShmChannel(ShmTransport& transport, UniqueFd sock, std::string peer, pid_t peer_pid);

  // Starts the reader thread (it holds the channel until the connection ends).
  void start_reader();

  // Gathered WRITEs and READs of host memory: at most 2048 pieces (two system calls) of at
  // most 1 MiB each, 16 MiB in all (shm_gather.cc); none for device memory.
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
  int streams() const override { return 1; }
  std::vector<std::pair<std::string, uint64_t>> attributes() const override;

  // Progress (core/request.h): the waiting thread reads the inbound ring for up to the
  // transport's wait budget (within `timeout_s`; none in event mode), handling what it finds,
  // until `terminal`; it returns the seconds of the wait it left uncovered (the reader
  // completes the request after that). waited() tunes the budget by the whole waits.
  double drive(const std::atomic<bool>& terminal, double timeout_s) override;
  void waited(int64_t waited_ns) override;
  // Nothing to do without a wait: drive() does the work.
  bool progress() override { return false; }

 private:
  struct Pending {
    RequestPtr request;
    RegionUse hold;  // the initiator's local range, read or written by the peer
    FrameType type = FrameType::kWrite;
    bool ipc = false;  // the local range is device memory, named by CUDA IPC
    PieceFailed failed;  // a gathered group's: told of each piece that failed
    size_t pieces = 0;   // and how many it has (0: one operation)
  };

  void run_reader();
  // Takes every record the inbound ring holds now and handles it, unless another thread is
  // doing so (`wait`: then after it); true when it handled any. Throws what handling a record
  // throws.
  bool consume(bool wait = false);
  bool try_consuming();
  void stop_consuming();
  // A driver leaves; the reader takes the ring back kHandBack later unless another comes.
  void stop_driving();
  // Run by the reader thread as it exits (the channel is closed): unmaps the rings and closes
  // the socket and doorbells, though the channel object may live on in its users.
  void release_fds();
  // Sleeps until the doorbell rings or the socket says the peer went away; false on the latter.
  bool sleep_until_work();
  // Reads what the socket holds now (VMM fds the peer shared) without waiting; false when the
  // peer closed it or died. Caller holds sock_mu_.
  bool read_socket();
  // Sends the fd of `local`'s VMM allocation unless this connection sent it already (nothing
  // for other memory, or a peer in this process). Throws Error(kConnection) when it fails.
  void share_vmm(const MemoryRegion& local);
  // The fd of the peer's VMM allocation `id`, waiting (bounded) for it on the socket.
  UniqueFd take_vmm_fd(uint64_t id);
  void on_record(const std::string& record);
  // `meta`: the record's metadata (a CUDA IPC name when the initiator's memory is device
  // memory, else empty; on an acknowledgement, why the copy failed).
  void serve_copy(const FrameHeader& h, const std::string& meta);
  void serve_notified_write(const FrameHeader& h, const std::string& meta);
  void on_ack(const FrameHeader& h, const std::string& meta);
  // A WRITE_GATHER / READ_GATHER group: posted, served (the record's list of pieces is its
  // data), acknowledged.
  RequestPtr post_gather(FrameType type, const std::shared_ptr<MemoryRegion>& local,
                         const std::vector<GatherPiece>& pieces, PieceFailed failed);
  void serve_gather(const FrameHeader& h, const std::string& record);
  // A served group whose pieces were checked, with its copy and acknowledgement still to do
  // (shm_gather.cc): run by one of the transport's gather workers, so that the next group is
  // copied while this one is, or by the consuming thread when no worker starts.
  struct GatherWork;
  void finish_gather(GatherWork& work);
  // Waits until no group of another kind than `type` is being copied (of any kind, for a
  // record that is not a group): a record sees the bytes of the groups before it, as it would
  // had they been copied in ring order. Returns early when the channel closes.
  void wait_gathers(FrameType type);
  void on_gather_ack(const FrameHeader& h, const std::string& meta);
  // Moves `length` bytes between `local` (in `region`, this process) and the initiator's range
  // (named by `meta` for CUDA IPC, else at host address `remote`): into `local` when `pull`.
  // Returns 0 or the errno of a failed CMA call; throws Error when a CUDA call fails.
  int move(const MemoryRegion& region, const std::string& meta, bool pull, uint8_t* local,
           uint64_t remote, uint64_t length);
  // The metadata naming [addr, addr+length) of `local` in a record: its CUDA IPC name for device
  // memory, else empty.
  static std::string name_of(const MemoryRegion& local, const uint8_t* addr);
  // Appends a record for the peer; waits (bounded) while the ring is full.
  void push(const FrameHeader& h, const std::string& meta, const uint8_t* data, uint64_t len);
  void start_one_sided(OpKind op, const RequestPtr& req,
                       const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                       const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                       const TransferOptions& options) override;
  void track(uint64_t op, Pending pending);
  // Takes operation `op` off the books into `out`; false when it is not there (a close failed
  // it meanwhile).
  bool take_pending(uint64_t op, Pending* out);
  void shut(ErrorKind kind, const std::string& reason);

  ShmTransport& transport_;
  UniqueFd sock_;
  const std::string peer_;
  const pid_t peer_pid_;
  std::unique_ptr<ShmRing> in_;   // the peer writes, we read (with consuming_ held, or the
                                  // reader thread, which alone resets it)
  std::atomic<bool> consuming_{false};  // a thread takes records from in_
  std::atomic<int> drivers_{0};         // threads in drive()
  std::atomic<int64_t> hand_back_ns_{0};  // steady clock: when the reader re-arms the doorbell
  SpinBudget reader_linger_;  // how long the reader spins on an empty ring (the poll mode's)
  std::unique_ptr<ShmRing> out_;  // we write, the peer reads
  std::mutex out_mu_;
  mutable std::mutex mu_;
  ClosedState state_;
  std::unordered_map<uint64_t, Pending> pending_;
  GrantTable grants_;
  std::atomic<uint64_t> next_op_{1};
  std::mutex gather_mu_;
  std::condition_variable gather_cv_;
  uint32_t gathers_running_ = 0;  // groups served and not yet acknowledged (gather_mu_)
  FrameType gathers_type_ = FrameType::kWriteGather;  // their kind
  std::mutex sock_mu_;                             // reads and writes of sock_ after set-up
  std::unordered_map<uint64_t, UniqueFd> vmm_in_;  // fds of the peer's VMM allocations, by id
  std::unordered_set<uint64_t> vmm_out_;           // ids of ours sent to the peer
  IpcPeerMemory ipc_;                  // the peer's device memory opened here
  std::atomic<uint64_t> ipc_bytes_{0};  // bytes moved by CUDA IPC (either end's copies)
};

}  // namespace rdmaxfer

// Memory regions: registered ranges of local memory that operations read from or write into.
//
// Lifecycle of a MemoryRegion:
//   registered (in the RegionTable; its key admits remote accesses allowed by `access`)
//   -> in use (each in-flight operation that touches the memory holds a RegionUse)
//   -> deregistered (removed from the table: its key is dead for new remote accesses; the
//      deregistering call waits, bounded, until the in-flight uses have ended, then revokes
//      the region at once: on verbs the MR is destroyed, so the old rkey stops working even
//      while the object lives on; local operations refuse a revoked region).
// A region allocated by the engine (pinned host memory) owns its pages and frees them last.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace rdmaxfer {

// Access rights on a region (the ibv_access_flags subset we use). The remote bits say what a
// peer may do; kAccessLocalWrite says that local operations may write the memory (a READ lands
// in it, a RECV fills it). Each registration asks only for the rights its uses need: memory that
// is only a source (served to remote READs, sent, written from) has no local write right, so
// read-only memory (a read-only file mapping, a read-only array, bytes) can be registered.
// Remote write implies local write (verbs requires it).
enum Access : uint32_t {
  kAccessLocal = 0,
  kAccessRemoteRead = 1u << 0,
  kAccessRemoteWrite = 1u << 1,
  kAccessLocalWrite = 1u << 2,
};
constexpr uint32_t kAccessRemoteMask = kAccessRemoteRead | kAccessRemoteWrite;

// Page-aligned host memory locked into RAM with mlock(2). Freed (munlock + munmap) on destruction.
class PinnedAllocation {
 public:
  explicit PinnedAllocation(uint64_t length);
  PinnedAllocation(const PinnedAllocation&) = delete;
  PinnedAllocation& operator=(const PinnedAllocation&) = delete;
  ~PinnedAllocation();
  uint8_t* data() const { return data_; }
  uint64_t mapped_length() const { return mapped_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t mapped_ = 0;
};

// The RLIMIT_MEMLOCK soft limit as `ulimit -l` prints it ("unlimited" or KiB).
std::string memlock_limit_text();

// Throws Error(kRegistration) unless every page of [addr, addr+length) is mapped (mincore(2)):
// registering freed memory must fail here, not crash when a peer writes into it.
void check_mapped(const uint8_t* addr, uint64_t length);

class MemoryRegion {
 public:
  MemoryRegion(uint8_t* addr, uint64_t length, uint32_t access,
               std::unique_ptr<PinnedAllocation> owned);
  virtual ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  uint8_t* addr() const { return addr_; }
  uint64_t length() const { return length_; }
  uint32_t access() const { return access_; }
  bool local_write() const { return (access_ & kAccessLocalWrite) != 0; }
  bool pinned() const { return owned_ != nullptr; }
  // The key a peer names this region by (the rkey on verbs); 0 until the table assigns it.
  uint32_t key() const { return key_; }
  void set_key(uint32_t key) { key_ = key; }
  // The key local work requests use (the lkey on verbs; equal to key() on TCP).
  virtual uint32_t lkey() const { return key_; }
  // The key its descriptor carries now: key(), except on verbs, where a rail-0 device that came
  // back gave the memory a new rkey there (transport/rdma/verbs_mr.h).
  virtual uint32_t wire_key() const { return key_; }
  // The keys of the same memory on the transport's other rails (verbs on several devices: an
  // rkey per extra device, in rail order); its descriptor carries them. Empty on one rail.
  virtual std::vector<uint32_t> rail_keys() const { return {}; }
  // The rail nearest the memory (verbs: the NIC nearest its GPU), which transfers too small to
  // stripe prefer; -1: none. Ignored by transports without rails.
  virtual int home_rail() const { return -1; }
  virtual void set_home_rail(int /*rail*/) {}
  // False for memory the CPU cannot address (GPU memory shared by CUDA IPC,
  // transport/shm/cuda_ipc.h): transports that copy with the CPU refuse remote access to it.
  virtual bool cpu_addressable() const { return true; }

  // Ends the registration (after the in-flight uses ended): the transport's handle is freed
  // (verbs: ibv_dereg_mr) and local operations refuse the region from then on.
  void revoke();
  bool revoked() const;

  // True when [addr, addr+len) lies inside the region (overflow-safe).
  bool contains(uint64_t addr, uint64_t len) const;

  void add_use();
  void drop_use();
  // Waits until no operation uses the region; false when `timeout_s` ran out first.
  bool wait_unused(double timeout_s);
  int uses() const;

 protected:
  // The transport's part of revoke(); called once, with no operation using the region.
  virtual void release_handle() {}

 private:
  uint8_t* addr_;
  uint64_t length_;
  uint32_t access_;
  uint32_t key_ = 0;
  std::unique_ptr<PinnedAllocation> owned_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int uses_ = 0;
  bool revoked_ = false;
};

// How a local operation uses its region: as a source (WRITE, SEND) or a destination (READ,
// RECV: needs kAccessLocalWrite).
enum class LocalUse { kSource, kDestination };

// Throws Error(kInvalidArgument) unless `local` is set and live (not revoked), allows `use`, and
// [offset, offset+length) lies inside it; `what` names the operation ("WRITE", "RECV"...) in the
// message. Every transport checks local ranges through this before posting.
void check_local_range(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                       uint64_t length, const char* what, LocalUse use = LocalUse::kSource);

// Holds a region in use for the duration of one operation (RAII).
class RegionUse {
 public:
  RegionUse() = default;
  explicit RegionUse(std::shared_ptr<MemoryRegion> region);
  RegionUse(RegionUse&& other) noexcept = default;
  RegionUse& operator=(RegionUse&& other) noexcept;
  RegionUse(const RegionUse&) = delete;
  RegionUse& operator=(const RegionUse&) = delete;
  ~RegionUse();
  MemoryRegion* get() const { return region_.get(); }
  explicit operator bool() const { return region_ != nullptr; }

 private:
  void release();
  std::shared_ptr<MemoryRegion> region_;
};

// Why a remote access was refused (also carried on the wire as a status code).
enum class AccessStatus : uint32_t {
  kOk = 0,
  kUnknownKey = 1,
  kOutOfBounds = 2,
  kNotPermitted = 3,
  kNotCpuAddressable = 4,  // a CPU-copying transport met GPU memory (MemoryRegion::cpu_addressable)
};
const char* access_status_text(AccessStatus status);

// The engine's registered regions, by key. Thread-safe.
class RegionTable {
 public:
  // Assigns a fresh non-zero key from the kernel's CSPRNG (common/random.h) and inserts the
  // region.
  void insert(const std::shared_ptr<MemoryRegion>& region);  // keeps a key already set (rkey)
  // Removes the region's key; later remote accesses with it are refused.
  bool erase(uint32_t key);
  // Checks a remote access and, when allowed, returns the region held in use. `by_cpu`: the
  // caller's transport copies with the CPU (TCP): memory the CPU cannot address is refused.
  AccessStatus acquire(uint32_t key, uint64_t addr, uint64_t len, uint32_t needed,
                       RegionUse* use, bool by_cpu = false) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint32_t, std::shared_ptr<MemoryRegion>> regions_;
};

}  // namespace rdmaxfer

// The stand-in CUDA driver's state and helpers, shared by its entry points
// (cuda_standin.cc: the driver API; cuda_standin_ipc.cc: CUDA IPC). Tests only.
#pragma once

#include <sys/mman.h>
#include <unistd.h>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace standin {


using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;

inline constexpr CUresult kSuccess = 0;
inline constexpr CUresult kInvalidValue = 1;
inline constexpr CUresult kOutOfMemory = 2;
inline constexpr CUresult kNotInitialized = 3;
inline constexpr CUresult kInvalidDevice = 101;
inline constexpr CUresult kInvalidHandle = 400;
inline constexpr CUresult kNotReady = 600;
inline constexpr CUresult kNotSupported = 801;

inline constexpr int kPointerAttrMemoryType = 2;
inline constexpr int kPointerAttrSyncMemops = 6;
inline constexpr int kPointerAttrBufferId = 7;
inline constexpr int kPointerAttrIsManaged = 8;
inline constexpr int kPointerAttrDeviceOrdinal = 9;
inline constexpr unsigned kMemoryTypeHost = 1;
inline constexpr unsigned kMemoryTypeDevice = 2;

inline constexpr uint64_t kTotalMemory = 16ULL << 30;  // what cuDeviceTotalMem reports, bytes

struct DeviceAllocation {
  uint8_t* shadow = nullptr;  // the read-write view the copies use
  size_t mapped = 0;          // bytes mapped (the size rounded up to pages)
  size_t size = 0;            // bytes asked for
  int device = 0;
  bool sync_memops = false;
  int fd = -1;            // the memfd behind it, kept for CUDA IPC exports (-1: imported)
  bool imported = false;  // opened from another process's handle (cuIpcOpenMemHandle)
  unsigned long long vmm = 0;  // cuMemMap'd: the physical allocation's handle (0: cuMemAlloc)
  unsigned long long buffer_id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused
};

// One stream: a worker thread that runs its tasks in order.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  uint64_t queued = 0;  // tasks ever queued
  uint64_t done = 0;    // tasks ever finished
  bool stop = false;
  std::thread worker;

  Stream() : worker([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [this] { return stop || !tasks.empty(); });
      if (tasks.empty()) return;  // stopping and drained
      std::function<void()> task = std::move(tasks.front());
      tasks.pop_front();
      lock.unlock();
      task();
      lock.lock();
      ++done;
      cv.notify_all();
    }
  }
  uint64_t push(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu);
    tasks.push_back(std::move(task));
    cv.notify_all();
    return ++queued;
  }
  void wait_for(uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done >= ticket; });
  }
  bool reached(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu);
    return done >= ticket;
  }
  uint64_t last_ticket() {
    std::lock_guard<std::mutex> lock(mu);
    return queued;
  }
};

// An event: the stream and the ticket of the work recorded before it.
struct Event {
  Stream* stream = nullptr;
  uint64_t ticket = 0;
};

struct State {
  std::mutex mu;
  bool initialized = false;
  int devices = 1;
  long delay_us = 0;
  std::map<uintptr_t, DeviceAllocation> device_allocations;  // by device address
  std::set<uintptr_t> host_allocations;                     // cuMemHostAlloc'd, by address
  std::map<uintptr_t, size_t> host_sizes;
  std::set<Stream*> streams;
  std::set<Event*> events;
  Stream* default_stream = nullptr;
  CUdeviceptr last_export_ptr = 0;  // cuMemGetHandleForAddressRange's last range
  size_t last_export_size = 0;
  int contexts[8] = {};  // the primary contexts' addresses stand in for CUcontext handles
  // The VMM API (cuda_standin_vmm.cc): physical allocations by handle, reserved ranges.
  struct Physical {
    int fd = -1;    // the memfd holding the pages
    size_t size = 0;
    int refs = 0;   // handles (cuMemCreate, retain, import) and mappings not yet released
  };
  std::map<unsigned long long, Physical> physical;
  unsigned long long next_physical = 1;
  std::map<uintptr_t, size_t> reserved;  // cuMemAddressReserve'd ranges, by address
  unsigned long long last_buffer_id = 0;  // the last CU_POINTER_ATTRIBUTE_BUFFER_ID given
};

inline State& state() {
  static State* s = new State();  // never destroyed: worker threads may outlive static dtors
  return *s;
}

inline thread_local int current_device = 0;  // set by cuCtxSetCurrent

inline size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

inline bool peermem() {
  const char* on = std::getenv("RDMAXFER_CUDA_STANDIN_PEERMEM");
  return on != nullptr && std::strcmp(on, "1") == 0;
}

// Records device allocation `a` at address `at`, with a fresh buffer id (cuMemAlloc,
// cuIpcOpenMemHandle and cuMemMap make one each). Caller holds state().mu.
inline void add_device(uintptr_t at, DeviceAllocation a) {
  State& s = state();
  a.buffer_id = ++s.last_buffer_id;
  s.device_allocations[at] = a;
}

// The allocation holding [ptr, ptr+len), or nullptr. Caller holds state().mu.
inline DeviceAllocation* find_device(uintptr_t ptr, size_t len, uintptr_t* base) {
  State& s = state();
  auto it = s.device_allocations.upper_bound(ptr);
  if (it == s.device_allocations.begin()) return nullptr;
  --it;
  if (ptr < it->first || ptr - it->first > it->second.size ||
      len > it->second.size - (ptr - it->first)) {
    return nullptr;
  }
  if (base != nullptr) *base = it->first;
  return &it->second;
}

// The read-write address for device address `ptr` spanning `len` bytes, or nullptr.
inline uint8_t* shadow_of(CUdeviceptr ptr, size_t len) {
  std::lock_guard<std::mutex> lock(state().mu);
  uintptr_t base = 0;
  DeviceAllocation* a = find_device(static_cast<uintptr_t>(ptr), len, &base);
  return a == nullptr ? nullptr : a->shadow + (static_cast<uintptr_t>(ptr) - base);
}

// The stream a handle names: 0, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are the
// default stream. nullptr for an unknown handle.
inline Stream* stream_of(void* handle) {
  State& s = state();
  const auto h = reinterpret_cast<uintptr_t>(handle);
  std::lock_guard<std::mutex> lock(s.mu);
  if (h <= 2) {
    if (s.default_stream == nullptr) s.default_stream = new Stream();
    return s.default_stream;
  }
  auto* stream = static_cast<Stream*>(handle);
  return s.streams.count(stream) != 0 ? stream : nullptr;
}

inline bool event_known(Event* e) {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().events.count(e) != 0;
}

inline CUresult enqueue_copy(void* dst, const void* src, size_t n, void* stream_handle) {
  Stream* stream = stream_of(stream_handle);
  if (stream == nullptr) return kInvalidHandle;
  const long delay = state().delay_us;
  stream->push([dst, src, n, delay] {
    if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    std::memcpy(dst, src, n);
  });
  return kSuccess;
}

// What an event waits for: its stream (nullptr when never recorded) and ticket.
inline Event recorded(const Event* event) {
  std::lock_guard<std::mutex> lock(state().mu);
  return *event;
}


}  // namespace standin

#include "transport/storage/file_reader.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <system_error>
#include <thread>

#include "common/cpus.h"
#include "common/error.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_context.h"
#include "cuda/cuda_memory.h"
#include "transport/storage/uring.h"

namespace rdmaxfer {

namespace {

// Ranges of a copied read further apart than this are read by separate reads.
constexpr uint64_t kMaxGap = 256ull << 10;

struct Segment {
  uint64_t file_offset;
  uint64_t length;
  uint64_t dest;
  bool on_device;
};

// One read: `length` bytes (a multiple of the alignment) at `file_offset`, into `target` (a
// direct range) or a bounce slot, whose bytes then go to `segments`.
struct ReadJob {
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint8_t* target = nullptr;  // nullptr: a bounce slot
  std::vector<Segment> segments;
  uint64_t done = 0;  // bytes read so far (a short read is continued)
  int slot = -1;
};

uint64_t round_down(uint64_t v, uint64_t a) { return v & ~(a - 1); }
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

// Aligned host memory for the bounce slots: page-locked by the CUDA driver when device copies
// go through it, else anonymous pages. Freed on destruction.
class BounceMemory {
 public:
  BounceMemory(uint64_t length, bool pinned) : length_(length) {
    if (length == 0) return;
    if (pinned) {
      pinned_ = std::make_unique<PinnedHostAllocation>(CudaContext::get(0), length);
      data_ = pinned_->data();
      return;
    }
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      throw Error(ErrorKind::kRegistration, errno_text("mmap of the file read buffers", e), e);
    }
    data_ = static_cast<uint8_t*>(p);
  }
  ~BounceMemory() {
    if (pinned_ == nullptr && data_ != nullptr) munmap(data_, length_);
  }
  BounceMemory(const BounceMemory&) = delete;
  BounceMemory& operator=(const BounceMemory&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint64_t length_;
  uint8_t* data_ = nullptr;
  std::unique_ptr<PinnedHostAllocation> pinned_;
};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// Faults in the destination pages of the direct reads on a second thread, ahead of the reads.
// An O_DIRECT read pins its destination when it is submitted, and new memory is allocated and
// zeroed page by page right then, on the submitting thread: about 0.5 s of CPU per GiB in
// 4 KiB pages, which would bound the load below the disk's rate. MADV_POPULATE_WRITE only
// allocates pages not yet present and never changes a byte, so it is safe beside reads that
// are landing; it skips reads already submitted. Where it is unknown (EINVAL, Linux < 5.14)
// or refused, the thread stops and the reads fault their pages in themselves. Stopped and
// joined on destruction.
class Prefaulter {
 public:
  // `spans`: the direct reads' destinations in submission order; the first `ahead` are
  // submitted at once and left to the reads.
  Prefaulter(std::vector<std::pair<uint8_t*, uint64_t>> spans, size_t ahead)
      : spans_(std::move(spans)) {
    if (spans_.size() <= ahead || !two_cpus()) return;
    try {
      thread_ = std::thread([this, ahead] { run(ahead); });
    } catch (const std::system_error&) {
      // No thread to spare (EAGAIN): the reads fault their pages in themselves.
    }
  }
  ~Prefaulter() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

  // The submitting thread has submitted the first `n` direct reads.
  void submitted(size_t n) { submitted_.store(n, std::memory_order_relaxed); }

 private:
  static bool two_cpus() { return usable_cpus() >= 2; }

  void run(size_t from) {
    const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    for (size_t i = from; i < spans_.size(); ++i) {
      if (stop_.load(std::memory_order_relaxed)) return;
      if (i < submitted_.load(std::memory_order_relaxed)) continue;  // its read pinned it
      const auto start = reinterpret_cast<uint64_t>(spans_[i].first);
      const uint64_t first = round_down(start, page);
      const uint64_t end = round_up(start + spans_[i].second, page);
      if (madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE) != 0) {
        return;
      }
    }
  }

  std::vector<std::pair<uint8_t*, uint64_t>> spans_;
  std::atomic<size_t> submitted_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string at_offset(const std::string& path, uint64_t offset) {
  return "'" + path + "' at offset " + std::to_string(offset);
}

void plan_direct(const std::vector<FileRange>& ranges, const FileReadOptions& o,
                 const std::string& path, std::deque<ReadJob>* jobs) {
  for (const FileRange& r : ranges) {
    if (r.file_offset % o.align != 0 || r.length % o.align != 0 || r.dest % o.align != 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "direct read of " + at_offset(path, r.file_offset) + " (" +
                      std::to_string(r.length) + " bytes) is not aligned to " +
                      std::to_string(o.align) + " bytes");
    }
    for (uint64_t at = 0; at < r.length; at += o.chunk) {
      ReadJob j;
      j.file_offset = r.file_offset + at;
      j.length = std::min(o.chunk, r.length - at);
      j.target = reinterpret_cast<uint8_t*>(r.dest + at);
      jobs->push_back(std::move(j));
    }
  }
}

// Copied ranges, sorted by file offset, packed into block-aligned reads of at most one chunk.
void plan_copied(std::vector<FileRange> ranges, const FileReadOptions& o,
                 std::deque<ReadJob>* jobs) {
  std::sort(ranges.begin(), ranges.end(),
            [](const FileRange& a, const FileRange& b) { return a.file_offset < b.file_offset; });
  ReadJob* open = nullptr;
  for (const FileRange& r : ranges) {
    uint64_t pos = r.file_offset;
    const uint64_t end = r.file_offset + r.length;
    while (pos < end) {
      const bool fits = open != nullptr && pos >= open->file_offset &&
                        pos < open->file_offset + o.chunk &&
                        pos <= open->file_offset + open->length + kMaxGap;
      if (!fits) {
        jobs->push_back(ReadJob());
        open = &jobs->back();
        open->file_offset = round_down(pos, o.align);
      }
      const uint64_t take = std::min(end, open->file_offset + o.chunk) - pos;
      open->segments.push_back(Segment{pos, take, r.dest + (pos - r.file_offset), r.on_device});
      open->length = std::max(open->length, round_up(pos + take - open->file_offset, o.align));
      pos += take;
    }
  }
}

class Reader {
 public:
  Reader(int fd, const std::string& path, uint64_t file_size, const FileReadOptions& o,
         const std::shared_ptr<DeviceCopier>& copier, bool any_device)
      : fd_(fd), path_(path), file_size_(file_size), o_(o) {
    if (any_device && copier == nullptr) {
      throw Error(ErrorKind::kInvalidArgument, "device ranges of " + path + " without a copier");
    }
    std::string why;
    const bool pinned = any_device && cuda_api(&why) != nullptr;
    bounce_ = std::make_unique<BounceMemory>(o.chunk * static_cast<uint64_t>(o.depth), pinned);
    if (any_device) {
      copier->bind_thread();
      lane_ = copier->open_lane(o.depth);
    }
    for (int s = 0; s < o.depth; ++s) free_slots_.push_back(s);
  }

  FileReadStats run(std::deque<ReadJob> jobs) {
    std::string why;
    std::unique_ptr<Uring> ring;
    if (o_.use_uring) ring = Uring::open(static_cast<unsigned>(o_.depth), &why);
    stats_.engine = ring != nullptr ? "io_uring" : "pread (" + (o_.use_uring ? why : "asked") + ")";
    std::vector<std::pair<uint8_t*, uint64_t>> spans;
    if (o_.prefault) {
      for (const ReadJob& j : jobs) {
        if (j.target != nullptr) spans.emplace_back(j.target, j.length);
      }
    }
    Prefaulter prefaulter(std::move(spans), static_cast<size_t>(o_.depth));
    try {
      read_all(std::move(jobs), ring.get(), &prefaulter);
    } catch (...) {
      if (ring != nullptr) drain(*ring);  // no read may still land in memory freed next
      throw;
    }
    return stats_;
  }

 private:
  void read_all(std::deque<ReadJob> jobs, Uring* ring, Prefaulter* prefaulter) {
    size_t direct_submitted = 0;
    std::vector<UringCompletion> done(static_cast<size_t>(o_.depth));
    std::vector<ReadJob> in_flight(static_cast<size_t>(o_.depth));
    std::vector<int> free_ids;
    for (int i = o_.depth - 1; i >= 0; --i) free_ids.push_back(i);
    int busy = 0;
    while (!jobs.empty() || busy > 0) {
      while (!jobs.empty() && !free_ids.empty()) {
        ReadJob& next = jobs.front();
        if (next.target == nullptr && next.slot < 0) {
          if (free_slots_.empty()) break;
          next.slot = take_slot();
        }
        const int id = free_ids.back();
        free_ids.pop_back();
        if (next.target != nullptr && next.done == 0) prefaulter->submitted(++direct_submitted);
        in_flight[static_cast<size_t>(id)] = std::move(next);
        jobs.pop_front();
        ReadJob& j = in_flight[static_cast<size_t>(id)];
        if (ring != nullptr) {
          ring->read(fd_, buffer_of(j) + j.done, static_cast<uint32_t>(j.length - j.done),
                     j.file_offset + j.done, static_cast<uint64_t>(id));
          ++busy;
          ++in_kernel_;
        } else {
          const ssize_t n = ::pread(fd_, buffer_of(j) + j.done, j.length - j.done,
                                    static_cast<off_t>(j.file_offset + j.done));
          done[0] = UringCompletion{static_cast<uint64_t>(id),
                                    static_cast<int32_t>(n < 0 ? -errno : n)};
          ++busy;
          finish(done[0], in_flight, &free_ids, &jobs, &busy);
        }
      }
      if (busy == 0) continue;
      if (ring == nullptr) continue;
      const int n = ring->submit_and_wait(done.data(), o_.depth, o_.timeout_s);
      in_kernel_ -= n;
      if (n == 0) {
        throw Error(ErrorKind::kTimeout, "reading '" + path_ + "': no read completed in " +
                                             std::to_string(o_.timeout_s) + " s");
      }
      for (int i = 0; i < n; ++i) finish(done[static_cast<size_t>(i)], in_flight, &free_ids,
                                         &jobs, &busy);
    }
    for (int s = 0; s < o_.depth && lane_ != nullptr; ++s) wait_slot(s);
  }

  // Waits (each wait bounded by the timeout) for the reads still in the kernel.
  void drain(Uring& ring) {
    std::vector<UringCompletion> done(static_cast<size_t>(o_.depth));
    while (in_kernel_ > 0) {
      int n = 0;
      try {
        n = ring.submit_and_wait(done.data(), o_.depth, o_.timeout_s);
      } catch (const Error&) {
        return;
      }
      if (n == 0) return;
      in_kernel_ -= n;
    }
  }
  uint8_t* buffer_of(const ReadJob& j) const {
    return j.target != nullptr ? j.target
                               : bounce_->data() + static_cast<uint64_t>(j.slot) * o_.chunk;
  }

  int take_slot() {
    const int s = free_slots_.front();
    free_slots_.pop_front();
    if (lane_ != nullptr) wait_slot(s);  // its last host-to-device copy left the buffer
    return s;
  }

  void wait_slot(int s) {
    if (!lane_->wait(s, o_.timeout_s)) {
      throw Error(ErrorKind::kTimeout, "copying '" + path_ + "' to the device: no copy finished in " +
                                           std::to_string(o_.timeout_s) + " s");
    }
  }

  void finish(const UringCompletion& c, std::vector<ReadJob>& in_flight, std::vector<int>* free_ids,
              std::deque<ReadJob>* jobs, int* busy) {
    --*busy;
    const int id = static_cast<int>(c.user_data);
    ReadJob& j = in_flight[static_cast<size_t>(id)];
    const uint64_t at = j.file_offset + j.done;
    if (c.result < 0) {
      throw Error(ErrorKind::kTransport, errno_text("read of " + at_offset(path_, at), -c.result),
                  -c.result);
    }
    ++stats_.reads;
    stats_.bytes_read += static_cast<uint64_t>(c.result);
    j.done += static_cast<uint64_t>(c.result);
    const uint64_t needed = std::min(j.length, file_size_ > j.file_offset ? file_size_ - j.file_offset : 0);
    if (j.done < needed) {
      if (c.result == 0) {
        throw Error(ErrorKind::kInvalidArgument,
                    "'" + path_ + "' is truncated: it ends at offset " + std::to_string(at) +
                        ", before the " + std::to_string(needed + j.file_offset) +
                        " bytes its header describes");
      }
      jobs->push_front(std::move(j));  // a short read: read the rest
      free_ids->push_back(id);
      return;
    }
    if (j.target == nullptr) copy_out(j);
    free_ids->push_back(id);
  }

  void copy_out(const ReadJob& j) {
    const uint8_t* base = bounce_->data() + static_cast<uint64_t>(j.slot) * o_.chunk;
    size_t device_left = 0;
    for (const Segment& s : j.segments) device_left += s.on_device ? 1 : 0;
    for (const Segment& s : j.segments) {
      const uint8_t* src = base + (s.file_offset - j.file_offset);
      ++stats_.copies;
      if (!s.on_device) {
        std::memcpy(reinterpret_cast<void*>(s.dest), src, s.length);
        continue;
      }
      lane_->to_device(j.slot, s.dest, src, s.length);
      if (--device_left > 0) wait_slot(j.slot);  // one copy per slot at a time
    }
    free_slots_.push_back(j.slot);
  }

  int fd_;
  const std::string& path_;
  uint64_t file_size_;
  FileReadOptions o_;
  std::unique_ptr<BounceMemory> bounce_;
  std::unique_ptr<CopyLane> lane_;
  std::deque<int> free_slots_;
  FileReadStats stats_;
  int in_kernel_ = 0;  // reads submitted to the ring whose completion was not reaped
};

}  // namespace

FileReadStats read_file_ranges(int fd, const std::string& path, uint64_t file_size,
                               const std::vector<FileRange>& direct,
                               const std::vector<FileRange>& copied,
                               const FileReadOptions& options,
                               const std::shared_ptr<DeviceCopier>& copier) {
  FileReadOptions o = options;
  if (o.align == 0 || (o.align & (o.align - 1)) != 0 || o.chunk < o.align || o.depth < 1 ||
      o.depth > 256 || o.chunk > (1ull << 30)) {
    throw Error(ErrorKind::kInvalidArgument,
                "file read options: align must be a power of two, chunk >= align and <= 1 GiB, "
                "depth 1..256");
  }
  o.chunk = round_up(o.chunk, o.align);
  for (const auto* ranges : {&direct, &copied}) {
    for (const FileRange& r : *ranges) {
      if (r.file_offset + r.length > round_up(file_size, o.align) ||
          (ranges == &copied && r.file_offset + r.length > file_size)) {
        throw Error(ErrorKind::kInvalidArgument,
                    "'" + path + "' is truncated: it ends at offset " + std::to_string(file_size) +
                        ", before the range at offset " + std::to_string(r.file_offset) + " (" +
                        std::to_string(r.length) + " bytes)");
      }
    }
  }
  std::deque<ReadJob> jobs;
  plan_direct(direct, o, path, &jobs);
  plan_copied(copied, o, &jobs);
  bool any_device = false;
  for (const FileRange& r : copied) any_device = any_device || r.on_device;
  Reader reader(fd, path, file_size, o, copier, any_device);
  return reader.run(std::move(jobs));
}

}  // namespace rdmaxfer

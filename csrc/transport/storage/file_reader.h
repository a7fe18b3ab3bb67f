// Reading byte ranges of a local file into memory at the disk's speed: O_DIRECT (or buffered)
// reads through io_uring (transport/storage/uring.h; pread where io_uring is unavailable),
// `depth` reads in flight, each aligned to the file system's block size.
//
// Two kinds of range:
// - direct ranges, read straight into their destination (host memory whose address, file
//   offset and length are multiples of the alignment): the load's own arrays;
// - copied ranges, of any offset and length, read into aligned bounce buffers (page-locked
//   when a DeviceCopier is given) and copied out: memcpy into host memory, or an asynchronous
//   host-to-device copy through the copier's lane, overlapped with the reads that follow.
//
// New destination memory of direct ranges is faulted in ahead of the reads on a second thread
// (MADV_POPULATE_WRITE), where there are two CPUs, so page allocation overlaps the reads.
//
// A read that fails names the file offset and errno; the file ending before a range does is
// Error(kInvalidArgument) "truncated" with the offset. Every wait is bounded by `timeout_s`
// without progress.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device_copier.h"

namespace rdmaxfer {

struct FileRange {
  uint64_t file_offset;
  uint64_t length;
  uint64_t dest;    // address of the destination's first byte
  bool on_device;   // dest is device memory (copied ranges only; needs a copier)
};

struct FileReadOptions {
  uint64_t align = 4096;          // the file system's block size (a power of two)
  uint64_t chunk = 4ull << 20;    // bytes per read
  int depth = 16;                 // reads in flight
  double timeout_s = 60.0;        // bound on each wait without progress
  bool use_uring = true;          // false: pread on this thread
  bool prefault = true;           // fault direct destinations in ahead, on a second thread
};

struct FileReadStats {
  uint64_t bytes_read = 0;   // bytes the reads returned (block rounding included)
  uint64_t reads = 0;        // read operations completed
  uint64_t copies = 0;       // bounce-buffer copies out (memcpy or host-to-device)
  std::string engine;        // "io_uring" or "pread (<why io_uring is not used>)"
};

// Reads `direct` and `copied` ranges of the open file `fd` (`file_size` bytes, opened with or
// without O_DIRECT) named `path` (for messages). `copier` is required when a copied range
// is on the device. Throws Error: kInvalidArgument (misaligned direct range, truncated file),
// kTransport (a failed read, with errno), kTimeout.
FileReadStats read_file_ranges(int fd, const std::string& path, uint64_t file_size,
                               const std::vector<FileRange>& direct,
                               const std::vector<FileRange>& copied,
                               const FileReadOptions& options,
                               const std::shared_ptr<DeviceCopier>& copier);

}  // namespace rdmaxfer

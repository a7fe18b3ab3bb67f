// Reading byte ranges of a local file straight into GPU memory with GPUDirect Storage
// (cuFileRead, cuda/cufile_api.h): the NVMe's DMA lands in device memory, no host bounce.
// Each destination range is registered with cuFileBufRegister for the call (and deregistered
// after); the file must be open with O_DIRECT (cuFileHandleRegister requires it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rdmaxfer {

struct GdsRange {
  uint64_t file_offset;
  uint64_t length;
  uint64_t dest;  // device address of the destination's first byte
};

struct GdsStats {
  uint64_t bytes_read = 0;
  uint64_t reads = 0;
};

// "" when GPUDirect Storage can be used here, else why not.
std::string gds_unavailable();

// Reads `ranges` of `fd` (`file_size` bytes, named `path` in errors) into GPU `device`'s
// memory, `chunk` bytes per cuFileRead. Throws Error: kUnsupported (no GDS here, the reason),
// kInvalidArgument (a range past the end of the file), kTransport (a failed cuFile call,
// naming the offset).
GdsStats read_file_gds(int fd, const std::string& path, uint64_t file_size, int device,
                       const std::vector<GdsRange>& ranges, uint64_t chunk);

}  // namespace rdmaxfer

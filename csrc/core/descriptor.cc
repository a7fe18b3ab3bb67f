#include "core/descriptor.h"

#include "common/bytes.h"
#include "common/error.h"
#include "core/region.h"

namespace rdmaxfer {

namespace {
constexpr uint8_t kDescriptorMagic[4] = {'R', 'X', 'M', 'R'};
}

const char* transport_kind_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kRdma: return "rdma";
    case TransportKind::kLoopback: return "loopback";
    case TransportKind::kShm: return "shm";
  }
  return "unknown";
}

std::string Descriptor::pack() const {
  std::string out(kSize + 4 * rail_keys.size(), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(p, kDescriptorMagic, 4);
  store_le<uint16_t>(p + 4, rail_keys.empty() ? kVersion : kVersionRails);
  p[6] = static_cast<uint8_t>(transport);
  p[7] = static_cast<uint8_t>(access);
  store_le<uint64_t>(p + 8, addr);
  store_le<uint64_t>(p + 16, length);
  store_le<uint32_t>(p + 24, key);
  p[28] = static_cast<uint8_t>(rail_keys.size());
  store_le<uint64_t>(p + 32, engine_id);
  for (size_t i = 0; i < rail_keys.size(); ++i) store_le<uint32_t>(p + kSize + 4 * i, rail_keys[i]);
  return out;
}

void check_remote_range(const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                        const char* what) {
  if (remote_offset > remote.length || length > remote.length - remote_offset) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": remote range offset " + std::to_string(remote_offset) +
                    " + " + std::to_string(length) + " bytes is outside the remote region of " +
                    std::to_string(remote.length) + " bytes (key " + std::to_string(remote.key) +
                    "); nothing was sent: check remote_offset and nbytes against the "
                    "descriptor's length");
  }
}

Descriptor Descriptor::unpack(const uint8_t* p, size_t size) {
  auto bad = [](const std::string& what) {
    throw Error(ErrorKind::kProtocol, "invalid memory descriptor: " + what +
                                          "; pass the bytes returned by MemoryRegion.descriptor()");
  };
  if (size < kSize) {
    bad("expected " + std::to_string(kSize) + " bytes, got " + std::to_string(size));
  }
  if (std::memcmp(p, kDescriptorMagic, 4) != 0) bad("bad magic (not an rdmaxfer descriptor)");
  const uint16_t version = load_le<uint16_t>(p + 4);
  if (version != kVersion && version != kVersionRails) {
    bad("unsupported version " + std::to_string(version) + " (this build reads versions " +
        std::to_string(kVersion) + " and " + std::to_string(kVersionRails) + ")");
  }
  const size_t extra = version == kVersionRails ? p[28] : 0;
  if (version == kVersionRails && extra == 0) bad("version 2 without rail keys");
  if (size != kSize + 4 * extra) {
    bad("expected " + std::to_string(kSize + 4 * extra) + " bytes, got " + std::to_string(size));
  }
  Descriptor d;
  if (p[6] < static_cast<uint8_t>(TransportKind::kTcp) ||
      p[6] > static_cast<uint8_t>(TransportKind::kShm)) {
    bad("unknown transport " + std::to_string(p[6]));
  }
  d.transport = static_cast<TransportKind>(p[6]);
  if ((p[7] & ~(kAccessRemoteRead | kAccessRemoteWrite)) != 0) {
    bad("unknown access bits 0x" + std::to_string(p[7]));
  }
  d.access = p[7];
  d.addr = load_le<uint64_t>(p + 8);
  d.length = load_le<uint64_t>(p + 16);
  d.key = load_le<uint32_t>(p + 24);
  if ((version == kVersion && p[28] != 0) || p[29] != 0 || p[30] != 0 || p[31] != 0) {
    bad("reserved field is not zero");
  }
  for (size_t i = 0; i < extra; ++i) {
    d.rail_keys.push_back(load_le<uint32_t>(p + kSize + 4 * i));
    if (d.rail_keys.back() == 0) bad("rail key 0 is never assigned");
  }
  d.engine_id = load_le<uint64_t>(p + 32);
  if (d.addr + d.length < d.addr) bad("addr + length overflows 64 bits");
  if (d.key == 0) bad("key 0 is never assigned");
  return d;
}

}  // namespace rdmaxfer

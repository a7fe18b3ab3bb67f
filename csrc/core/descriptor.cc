#include "core/descriptor.h"

#include "common/le_codec.h"
#include "common/error.h"
#include "core/region.h"

#include <cstdio>

namespace rdmaxfer {

namespace {
constexpr uint8_t kDescriptorMagic[4] = {'R', 'X', 'M', 'R'};
}

std::string Descriptor::pack() const {
  std::string out(kSize + 4 * rail_keys.size(), '\0');
  LeWriter w(reinterpret_cast<uint8_t*>(out.data()), out.size());
  w.bytes(kDescriptorMagic, 4)
      .put<uint16_t>(rail_keys.empty() ? kVersion : kVersionRails)
      .put<uint8_t>(transport)
      .put<uint8_t>(static_cast<uint8_t>(access))
      .put<uint64_t>(addr)
      .put<uint64_t>(length)
      .put<uint32_t>(key)
      .put<uint8_t>(static_cast<uint8_t>(rail_keys.size()))
      .put<uint16_t>(rail_keys.empty() ? 0 : generation)
      .skip(1)
      .put<uint64_t>(engine_id);
  for (uint32_t k : rail_keys) w.put<uint32_t>(k);
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
  LeReader r(p, size);
  if (!r.matches(kDescriptorMagic, 4)) bad("bad magic (not an rdmaxfer descriptor)");
  const uint16_t version = r.get<uint16_t>();
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
  d.transport = r.get<uint8_t>();
  if (!transport_id_known(d.transport)) bad("unknown transport " + std::to_string(d.transport));
  d.access = r.get<uint8_t>();
  if ((d.access & ~(kAccessRemoteRead | kAccessRemoteWrite)) != 0) {
    bad("unknown access bits 0x" + std::to_string(d.access));
  }
  d.addr = r.get<uint64_t>();
  d.length = r.get<uint64_t>();
  d.key = r.get<uint32_t>();
  const uint8_t n = r.get<uint8_t>();
  d.generation = r.get<uint16_t>();
  if ((version == kVersion && (n != 0 || d.generation != 0)) || !r.zeros(1)) {
    bad("reserved field is not zero");
  }
  d.engine_id = r.get<uint64_t>();
  for (size_t i = 0; i < extra; ++i) {
    d.rail_keys.push_back(r.get<uint32_t>());
    if (d.rail_keys.back() == 0) bad("rail key 0 is never assigned");
  }
  if (d.addr + d.length < d.addr) bad("addr + length overflows 64 bits");
  if (d.key == 0) bad("key 0 is never assigned");
  return d;
}

std::string engine_id_text(uint64_t engine_id) {
  char text[20];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(engine_id));
  return text;
}

}  // namespace rdmaxfer

#include "transport/ofi/ofi_wire.h"

#include <cstring>

#include "common/bytes.h"
#include "common/error.h"

namespace rdmaxfer {

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& why) {
  throw Error(ErrorKind::kProtocol, what + ": " + why);
}

}  // namespace

std::string OfiEndpointRecord::pack() const {
  std::string out(kHeaderSize + address.size() + provider.size(), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(p, "RXOF", 4);
  store_le<uint16_t>(p + 4, kVersion);
  store_le<uint16_t>(p + 6, static_cast<uint16_t>(address.size()));
  store_le<uint64_t>(p + 8, max_msg);
  store_le<uint16_t>(p + 16, static_cast<uint16_t>(provider.size()));
  std::memcpy(p + kHeaderSize, address.data(), address.size());
  std::memcpy(p + kHeaderSize + address.size(), provider.data(), provider.size());
  return out;
}

size_t OfiEndpointRecord::peek_size(const uint8_t* h) {
  const std::string what = "ofi endpoint record";
  if (std::memcmp(h, "RXOF", 4) != 0) bad(what, "bad magic");
  const uint16_t version = load_le<uint16_t>(h + 4);
  if (version != kVersion) bad(what, "unsupported version " + std::to_string(version));
  const size_t addr_len = load_le<uint16_t>(h + 6);
  const size_t prov_len = load_le<uint16_t>(h + 16);
  if (addr_len == 0 || addr_len > kMaxAddress) {
    bad(what, "address of " + std::to_string(addr_len) + " bytes (1.." +
                  std::to_string(kMaxAddress) + ")");
  }
  if (prov_len == 0 || prov_len > kMaxProvider) {
    bad(what, "provider name of " + std::to_string(prov_len) + " bytes");
  }
  for (size_t i = 18; i < kHeaderSize; ++i) {
    if (h[i] != 0) bad(what, "reserved bytes are not zero");
  }
  return kHeaderSize + addr_len + prov_len;
}

OfiEndpointRecord OfiEndpointRecord::unpack(const uint8_t* data, size_t size) {
  if (size < kHeaderSize) bad("ofi endpoint record", "only " + std::to_string(size) + " bytes");
  const size_t want = peek_size(data);
  if (size != want) {
    bad("ofi endpoint record",
        "expected " + std::to_string(want) + " bytes, got " + std::to_string(size));
  }
  OfiEndpointRecord r;
  const size_t addr_len = load_le<uint16_t>(data + 6);
  r.max_msg = load_le<uint64_t>(data + 8);
  if (r.max_msg == 0) bad("ofi endpoint record", "max_msg of 0");
  r.address.assign(reinterpret_cast<const char*>(data + kHeaderSize), addr_len);
  r.provider.assign(reinterpret_cast<const char*>(data + kHeaderSize + addr_len),
                    size - kHeaderSize - addr_len);
  return r;
}

void OfiFrameHeader::pack(uint8_t* out) const {
  std::memset(out, 0, kSize);
  out[0] = static_cast<uint8_t>(kind);
  out[1] = static_cast<uint8_t>(message.type);
  store_le<uint32_t>(out + 4, meta_len);
  store_le<uint64_t>(out + 8, message.msg_id);
  store_le<uint64_t>(out + 16, message.size);
  store_le<uint64_t>(out + 24, message.addr);
  store_le<uint32_t>(out + 32, message.key);
  store_le<uint32_t>(out + 36, message.route);
  store_le<uint32_t>(out + 40, data_len);
}

OfiFrameHeader OfiFrameHeader::unpack(const uint8_t* in) {
  const std::string what = "ofi control frame";
  OfiFrameHeader h;
  if (in[0] != static_cast<uint8_t>(OfiFrameKind::kCtrl) &&
      in[0] != static_cast<uint8_t>(OfiFrameKind::kGoodbye)) {
    bad(what, "unknown kind " + std::to_string(in[0]));
  }
  h.kind = static_cast<OfiFrameKind>(in[0]);
  if (h.kind == OfiFrameKind::kCtrl &&
      (in[1] < static_cast<uint8_t>(CtrlType::kRts) ||
       in[1] > static_cast<uint8_t>(CtrlType::kAbort))) {
    bad(what, "unknown control type " + std::to_string(in[1]));
  }
  h.message.type = static_cast<CtrlType>(in[1]);
  h.meta_len = load_le<uint32_t>(in + 4);
  h.message.msg_id = load_le<uint64_t>(in + 8);
  h.message.size = load_le<uint64_t>(in + 16);
  h.message.addr = load_le<uint64_t>(in + 24);
  h.message.key = load_le<uint32_t>(in + 32);
  h.message.route = load_le<uint32_t>(in + 36);
  h.data_len = load_le<uint32_t>(in + 40);
  if (h.meta_len > kMaxMeta) bad(what, "metadata of " + std::to_string(h.meta_len) + " bytes");
  if (h.data_len > kMaxData) bad(what, "data of " + std::to_string(h.data_len) + " bytes");
  if (h.kind == OfiFrameKind::kGoodbye && (h.meta_len != 0 || h.data_len != 0)) {
    bad(what, "a goodbye with a payload");
  }
  return h;
}

}  // namespace rdmaxfer

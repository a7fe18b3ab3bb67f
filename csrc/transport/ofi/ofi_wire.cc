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
  const std::string& first = addresses.at(0);
  std::string extra;
  for (size_t i = 1; i < addresses.size(); ++i) {
    uint8_t len[2];
    store_le<uint16_t>(len, static_cast<uint16_t>(addresses[i].size()));
    extra.append(reinterpret_cast<const char*>(len), 2);
    extra += addresses[i];
  }
  std::string out(kHeaderSize + first.size() + provider.size() + extra.size(), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(p, "RXOF", 4);
  store_le<uint16_t>(p + 4, addresses.size() > 1 ? kVersionRails : kVersion);
  store_le<uint16_t>(p + 6, static_cast<uint16_t>(first.size()));
  store_le<uint64_t>(p + 8, max_msg);
  store_le<uint16_t>(p + 16, static_cast<uint16_t>(provider.size()));
  p[18] = static_cast<uint8_t>(addresses.size() - 1);
  store_le<uint32_t>(p + 20, static_cast<uint32_t>(extra.size()));
  std::memcpy(p + kHeaderSize, first.data(), first.size());
  std::memcpy(p + kHeaderSize + first.size(), provider.data(), provider.size());
  std::memcpy(p + kHeaderSize + first.size() + provider.size(), extra.data(), extra.size());
  return out;
}

size_t OfiEndpointRecord::peek_size(const uint8_t* h) {
  const std::string what = "ofi endpoint record";
  if (std::memcmp(h, "RXOF", 4) != 0) bad(what, "bad magic");
  const uint16_t version = load_le<uint16_t>(h + 4);
  if (version != kVersion && version != kVersionRails) {
    bad(what, "unsupported version " + std::to_string(version));
  }
  const size_t addr_len = load_le<uint16_t>(h + 6);
  const size_t prov_len = load_le<uint16_t>(h + 16);
  const size_t extra_rails = h[18];
  const size_t extra_len = load_le<uint32_t>(h + 20);
  if (addr_len == 0 || addr_len > kMaxAddress) {
    bad(what, "address of " + std::to_string(addr_len) + " bytes (1.." +
                  std::to_string(kMaxAddress) + ")");
  }
  if (prov_len == 0 || prov_len > kMaxProvider) {
    bad(what, "provider name of " + std::to_string(prov_len) + " bytes");
  }
  if (h[19] != 0) bad(what, "reserved byte is not zero");
  if (version == kVersion && (extra_rails != 0 || extra_len != 0)) {
    bad(what, "version 1 with extra rails");
  }
  if (version == kVersionRails &&
      (extra_rails == 0 || extra_rails >= kMaxRails ||
       extra_len < extra_rails * 3 || extra_len > extra_rails * (2 + kMaxAddress))) {
    bad(what, std::to_string(extra_rails) + " extra rails in " + std::to_string(extra_len) +
                  " bytes (1.." + std::to_string(kMaxRails - 1) + " rails of 1.." +
                  std::to_string(kMaxAddress) + "-byte addresses)");
  }
  return kHeaderSize + addr_len + prov_len + extra_len;
}

OfiEndpointRecord OfiEndpointRecord::unpack(const uint8_t* data, size_t size) {
  const std::string what = "ofi endpoint record";
  if (size < kHeaderSize) bad(what, "only " + std::to_string(size) + " bytes");
  const size_t want = peek_size(data);
  if (size != want) {
    bad(what, "expected " + std::to_string(want) + " bytes, got " + std::to_string(size));
  }
  OfiEndpointRecord r;
  const size_t addr_len = load_le<uint16_t>(data + 6);
  const size_t prov_len = load_le<uint16_t>(data + 16);
  r.max_msg = load_le<uint64_t>(data + 8);
  if (r.max_msg == 0) bad(what, "max_msg of 0");
  r.addresses.emplace_back(reinterpret_cast<const char*>(data + kHeaderSize), addr_len);
  r.provider.assign(reinterpret_cast<const char*>(data + kHeaderSize + addr_len), prov_len);
  for (const char c : r.provider) {
    if (c < 0x20 || c > 0x7e) bad(what, "the provider's name is not printable ASCII");
  }
  size_t at = kHeaderSize + addr_len + prov_len;
  for (size_t i = 0; i < data[18]; ++i) {
    if (size - at < 2) bad(what, "the extra rails' block ends inside rail " + std::to_string(i + 1));
    const size_t len = load_le<uint16_t>(data + at);
    at += 2;
    if (len == 0 || len > kMaxAddress || size - at < len) {
      bad(what, "rail " + std::to_string(i + 1) + "'s address of " + std::to_string(len) +
                    " bytes does not fit the record");
    }
    r.addresses.emplace_back(reinterpret_cast<const char*>(data + at), len);
    at += len;
  }
  if (at != size) bad(what, std::to_string(size - at) + " bytes after the last rail's address");
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
  if (in[0] < static_cast<uint8_t>(OfiFrameKind::kCtrl) ||
      in[0] > static_cast<uint8_t>(OfiFrameKind::kRailUp)) {
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
  if ((h.kind == OfiFrameKind::kRailDown || h.kind == OfiFrameKind::kRejoinNo) &&
      h.data_len != 0) {
    bad(what, "a rail down or rejoin refusal with data");
  }
  if ((h.kind == OfiFrameKind::kRejoin || h.kind == OfiFrameKind::kRejoinOk ||
       h.kind == OfiFrameKind::kRailUp) &&
      (h.meta_len != 0 || h.data_len != 0)) {
    bad(what, "a rejoin message with a payload");
  }
  return h;
}

}  // namespace rdmaxfer

#include "transport/records.h"

#include <map>
#include <mutex>

#include "common/error.h"
#include "core/descriptor.h"
#include "transport/bootstrap.h"
#include "transport/wire.h"

namespace rdmaxfer {

namespace {
void need(size_t size, size_t want, const char* what) {
  if (size != want) {
    throw Error(ErrorKind::kProtocol, std::string(what) + ": expected " + std::to_string(want) +
                                          " bytes, got " + std::to_string(size));
  }
}

struct Parsers {
  std::mutex mu;
  std::map<std::string, RecordParser> by_kind;
};

// The records of the interface, and those transports register (built on first use: they
// register from static initialisers).
Parsers& parsers() {
  static Parsers p{{},
                   {{"descriptor",
                     [](const uint8_t* data, size_t size) {
                       Descriptor d = Descriptor::unpack(data, size);
                       return "descriptor length=" + std::to_string(d.length) +
                              " key=" + std::to_string(d.key);
                     }},
                    {"hello",
                     [](const uint8_t* data, size_t size) {
                       need(size, Hello::kSize, "hello");
                       Hello h = Hello::unpack(data);
                       return "hello stream " + std::to_string(h.stream_index) + "/" +
                              std::to_string(h.n_streams);
                     }},
                    {"hello_ack",
                     [](const uint8_t* data, size_t size) {
                       need(size, HelloAck::kSize, "hello_ack");
                       HelloAck a = HelloAck::unpack(data);
                       return "hello_ack status " + std::to_string(static_cast<int>(a.status));
                     }},
                    {"frame", [](const uint8_t* data, size_t size) {
                       need(size, FrameHeader::kSize, "frame");
                       FrameHeader f = FrameHeader::decode(data);
                       return std::string("frame ") + frame_type_name(f.type);
                     }}}};
  return p;
}
}  // namespace

RecordRegistration::RecordRegistration(std::string kind, RecordParser parse) {
  Parsers& p = parsers();
  std::lock_guard<std::mutex> lock(p.mu);
  p.by_kind[std::move(kind)] = std::move(parse);
}

std::vector<std::string> record_kinds() {
  Parsers& p = parsers();
  std::lock_guard<std::mutex> lock(p.mu);
  std::vector<std::string> out;
  for (const auto& [kind, parse] : p.by_kind) out.push_back(kind);
  return out;
}

std::string parse_record(const std::string& kind, const uint8_t* data, size_t size) {
  RecordParser parse;
  {
    Parsers& p = parsers();
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.by_kind.find(kind);
    if (it == p.by_kind.end()) {
      throw Error(ErrorKind::kInvalidArgument, "unknown record kind '" + kind + "'");
    }
    parse = it->second;
  }
  return parse(data, size);
}

}  // namespace rdmaxfer

#include "transport/transport.h"

#include "common/error.h"

namespace rdmaxfer {

std::shared_ptr<MemoryRegion> Transport::make_device_region(uint8_t*, uint64_t, uint32_t, int,
                                                            uint64_t) {
  throw Error(ErrorKind::kUnsupported,
              std::string("the ") + transport_kind_name(capabilities().kind) +
                  " transport moves bytes with the CPU and cannot register GPU memory; device "
                  "memory goes through staging (host bounce buffers)");
}

std::string Channel::describe() const {
  return "to " + peer() + ", " + std::to_string(streams()) + " stream(s)";
}

void Transport::attach_protocol(const std::shared_ptr<Channel>& channel) const {
  if (!protocol_) {
    throw Error(ErrorKind::kInvalidArgument,
                "the transport has no protocol for its connections (set_protocol)");
  }
  channel->attach(protocol_(channel));
}

Descriptor Transport::describe_region(const MemoryRegion& region) const {
  Descriptor d;
  d.transport = capabilities().kind;
  d.access = region.access() & kAccessRemoteMask;
  d.addr = reinterpret_cast<uint64_t>(region.addr());
  d.length = region.length();
  d.key = region.key();
  d.engine_id = engine_id_;
  return d;
}

}  // namespace rdmaxfer

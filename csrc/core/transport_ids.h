// The one-byte id each transport writes into descriptors (core/descriptor.h) and bootstrap
// hellos (transport/bootstrap.h), with the transport's name. The table is filled as transports
// register (transport/registry.h); an id is part of the wire format and never reused.
#pragma once

#include <cstdint>
#include <string>

namespace rdmaxfer {

// Records `id` as `name`'s. Throws Error(kInvalidArgument) when id 0 is given or `id` already
// names another transport.
void declare_transport_id(uint8_t id, const std::string& name);
bool transport_id_known(uint8_t id);
// The name declared for `id`, or "transport <id>" when none was.
std::string transport_id_name(uint8_t id);

}  // namespace rdmaxfer

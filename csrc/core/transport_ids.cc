#include "core/transport_ids.h"

#include <array>
#include <mutex>

#include "common/error.h"

namespace rdmaxfer {

namespace {
struct IdTable {
  std::mutex mu;
  std::array<std::string, 256> names;
};

// Built on first use: transports declare their ids from static initialisers.
IdTable& id_table() {
  static IdTable table;
  return table;
}
}  // namespace

void declare_transport_id(uint8_t id, const std::string& name) {
  IdTable& t = id_table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (id == 0 || name.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "transport '" + name + "': wire id 0 and empty names are never assigned");
  }
  if (!t.names[id].empty() && t.names[id] != name) {
    throw Error(ErrorKind::kInvalidArgument, "transport '" + name + "': wire id " +
                                                 std::to_string(id) + " is already '" +
                                                 t.names[id] + "''s; pick a free one");
  }
  t.names[id] = name;
}

bool transport_id_known(uint8_t id) {
  IdTable& t = id_table();
  std::lock_guard<std::mutex> lock(t.mu);
  return !t.names[id].empty();
}

std::string transport_id_name(uint8_t id) {
  IdTable& t = id_table();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.names[id].empty() ? "transport " + std::to_string(id) : t.names[id];
}

}  // namespace rdmaxfer

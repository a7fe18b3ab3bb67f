// The transports of this build, each registered by one line in its own folder:
//
//   const TransportRegistration kRegistration{TransportEntry{Capabilities..., unavailable,
//                                                            make, make_companion,
//                                                            auto_unavailable}};
//
// Nothing here (or in the rest of the interface) names an implementation: the engine, the
// bindings and Python choose among the entries by their declared Capabilities (transport.h).
// Registrations run from static initialisers of the transports' own files, which the build
// links into the extension module whole (an object library, CMakeLists.txt).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/poll_mode.h"
#include "transport/tls.h"
#include "transport/transport.h"

namespace rdmaxfer {

// What an engine hands every transport it makes: the settings all transports share, and those
// of one transport as text by name (`settings["rdma.gid_index"] = "3"`: the transport's name, a
// dot and its setting; each transport parses and checks its own).
struct TransportConfig {
  int io_threads = 0;        // I/O threads; 0: the transport's default
  int socket_buffer = 0;     // SO_SNDBUF/SO_RCVBUF bytes; 0: kernel autotuning
  int default_streams = 0;   // streams (or QPs) per connection; 0: the transport's default
  std::string secret;        // shared secret for the bootstrap (transport/auth.h); "" = none
  PollMode poll_mode = PollMode::kAdaptive;  // core/poll_mode.h
  std::map<std::string, std::string> settings;

  // settings["<transport>.<name>"], or `fallback` when absent.
  std::string setting(const std::string& transport, const std::string& name,
                      const std::string& fallback) const;
  // The same as an int; throws Error(kInvalidArgument) naming the setting when not one.
  int int_setting(const std::string& transport, const std::string& name, int fallback) const;
  // Whether settings["<transport>.tls"] ("0" or "1", default "0") turns TLS on for the
  // transport's bootstrap streams; *out gets the shared secret and its tls_cert, tls_key and
  // tls_ca. Throws Error(kInvalidArgument) naming the setting for another value.
  bool tls(const std::string& transport, TlsSettings* out) const;
  // The largest two-sided message a peer may announce to this engine (0: no bound).
  uint64_t max_message_bytes = 0;
};

struct TransportEntry {
  Capabilities caps;  // declared before any instance exists
  // "" when the transport can run on this machine, else why not; empty function: always.
  std::function<std::string()> unavailable;
  std::function<std::unique_ptr<Transport>(uint64_t engine_id, const TransportConfig&)> make;
  // With caps.same_host_companion: the companion serving `owner`'s registrations.
  std::function<std::unique_ptr<Transport>(Transport& owner, const TransportConfig&)>
      make_companion;
  // "" when transport="auto" may take it here, else why not; empty function: `unavailable`.
  std::function<std::string()> auto_unavailable;
};

// Constructing one registers `entry` (and declares its wire id, core/transport_ids.h). Throws
// Error(kInvalidArgument) for a name or wire id already registered.
class TransportRegistration {
 public:
  explicit TransportRegistration(TransportEntry entry);
};

// Every registered transport, listed or not, in name order.
std::vector<const TransportEntry*> registered_transports();
// The entry named `name`, or nullptr.
const TransportEntry* find_transport(const std::string& name);
// "" when `entry` can run here, else why not.
std::string unavailable_reason(const TransportEntry& entry);

// Listed transport name -> "" when usable on this machine, else why not.
std::map<std::string, std::string> available_transports();

// One network transport as transport="auto" weighs it: its auto_rank, and why auto may not take
// it here ("" when it may), asked only when every transport ranked above it was refused.
struct AutoCandidate {
  std::string name;
  int rank = 0;
  std::function<std::string()> refused;
};

// What transport="auto" took, and why: "rdma: ..." when the first ranked was usable, else each
// refusal of those ranked above it.
struct AutoChoice {
  std::string name;
  std::string why;
};

// The candidate of highest rank (ties: by name) whose `refused` is ""; ranks <= 0 never.
// Throws Error(kUnsupported) with every refusal when none is usable.
AutoChoice choose_automatic(std::vector<AutoCandidate> candidates);

// transport="auto" over the network transports of this build: verbs RC where a device offers
// it, then libfabric's hardware RDMA providers (EFA), then TCP.
AutoChoice automatic_network_transport();

// Throws Error(kInvalidArgument) for an unknown name; the transport throws Error(kUnsupported)
// with the reason when it cannot run here.
std::unique_ptr<Transport> make_transport(const std::string& name, uint64_t engine_id,
                                          const TransportConfig& config);

// The same-host companion of the engine's network transport `owner` (transport="auto",
// engine/wireup.h): the transport declaring same_host_companion. Throws Error(kUnsupported)
// with the reason when it cannot run here (or the build has none).
std::unique_ptr<Transport> make_same_host_companion(Transport& owner,
                                                    const TransportConfig& config);

}  // namespace rdmaxfer

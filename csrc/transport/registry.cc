#include "transport/registry.h"

#include <algorithm>
#include <mutex>

#include "common/error.h"
#include "core/transport_ids.h"

namespace rdmaxfer {

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<TransportEntry>> entries;
};

// Built on first use: the transports register from static initialisers.
Registry& registry() {
  static Registry r;
  return r;
}

std::string listed_names() {
  std::string names;
  for (const TransportEntry* e : registered_transports()) {
    if (e->caps.listed) names += "'" + e->caps.name + "', ";
  }
  return names + "or 'auto'";
}
}  // namespace

std::string TransportConfig::setting(const std::string& transport, const std::string& name,
                                     const std::string& fallback) const {
  auto it = settings.find(transport + "." + name);
  return it == settings.end() ? fallback : it->second;
}

bool TransportConfig::tls(const std::string& transport, TlsSettings* out) const {
  const std::string on = setting(transport, "tls", "0");
  if (on != "0" && on != "1") {
    throw Error(ErrorKind::kInvalidArgument, transport + ".tls=" + on + " must be 0 or 1");
  }
  *out = TlsSettings{secret, setting(transport, "tls_cert", ""), setting(transport, "tls_key", ""),
                     setting(transport, "tls_ca", "")};
  return on == "1";
}

int TransportConfig::int_setting(const std::string& transport, const std::string& name,
                                 int fallback) const {
  auto it = settings.find(transport + "." + name);
  if (it == settings.end()) return fallback;
  try {
    size_t used = 0;
    const int value = std::stoi(it->second, &used);
    if (used == it->second.size()) return value;
  } catch (const std::exception&) {
  }
  throw Error(ErrorKind::kInvalidArgument, transport + " setting " + name + "='" + it->second +
                                               "' is not an integer");
}

TransportRegistration::TransportRegistration(TransportEntry entry) {
  Registry& r = registry();
  const std::string name = entry.caps.name;
  declare_transport_id(entry.caps.wire_id, name);
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.entries.count(name) != 0) {
    throw Error(ErrorKind::kInvalidArgument, "transport '" + name + "' registered twice");
  }
  r.entries[name] = std::make_unique<TransportEntry>(std::move(entry));
}

std::vector<const TransportEntry*> registered_transports() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<const TransportEntry*> out;
  for (const auto& [name, entry] : r.entries) out.push_back(entry.get());
  return out;
}

const TransportEntry* find_transport(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.entries.find(name);
  return it == r.entries.end() ? nullptr : it->second.get();
}

std::string unavailable_reason(const TransportEntry& entry) {
  return entry.unavailable ? entry.unavailable() : std::string();
}

std::map<std::string, std::string> available_transports() {
  std::map<std::string, std::string> out;
  for (const TransportEntry* e : registered_transports()) {
    if (e->caps.listed) out[e->caps.name] = unavailable_reason(*e);
  }
  return out;
}

AutoChoice choose_automatic(std::vector<AutoCandidate> candidates) {
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const AutoCandidate& a, const AutoCandidate& b) {
                     return a.rank != b.rank ? a.rank > b.rank : a.name < b.name;
                   });
  std::string refusals;
  for (const AutoCandidate& c : candidates) {
    if (c.rank <= 0) continue;
    const std::string why_not = c.refused ? c.refused() : std::string();
    if (why_not.empty()) {
      return AutoChoice{c.name, refusals.empty() ? c.name + ": ranked first and usable here"
                                                 : c.name + ": " + refusals};
    }
    refusals += (refusals.empty() ? "" : "; ") + c.name + " not usable (" + why_not + ")";
  }
  throw Error(ErrorKind::kUnsupported,
              "transport 'auto': no network transport can run here" +
                  (refusals.empty() ? std::string(" (rdmaxfer info says why)")
                                    : ": " + refusals));
}

AutoChoice automatic_network_transport() {
  std::vector<AutoCandidate> candidates;
  for (const TransportEntry* e : registered_transports()) {
    if (!e->caps.network) continue;
    candidates.push_back(AutoCandidate{
        e->caps.name, e->caps.auto_rank,
        [e] { return e->auto_unavailable ? e->auto_unavailable() : unavailable_reason(*e); }});
  }
  return choose_automatic(std::move(candidates));
}

std::unique_ptr<Transport> make_transport(const std::string& name, uint64_t engine_id,
                                          const TransportConfig& config) {
  const TransportEntry* entry = find_transport(name);
  if (entry == nullptr) {
    throw Error(ErrorKind::kInvalidArgument,
                "unknown transport '" + name + "'; choose " + listed_names());
  }
  return entry->make(engine_id, config);  // which throws, with its reason, when it cannot run
}

std::unique_ptr<Transport> make_same_host_companion(Transport& owner,
                                                    const TransportConfig& config) {
  for (const TransportEntry* e : registered_transports()) {
    // The constructor throws, with its reason, when it cannot run here.
    if (e->caps.same_host_companion && e->make_companion) return e->make_companion(owner, config);
  }
  throw Error(ErrorKind::kUnsupported, "no transport serves same-host peers in this build");
}

}  // namespace rdmaxfer

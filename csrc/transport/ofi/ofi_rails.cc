// OfiChannel on several rails (ofi_channel.h: striping, failover): which rails a transfer may
// use, how a large one is shared out, what a failed rail changes, and how the rails are shown.
// Rejoining is in ofi_heal.cc, the rest of the channel in ofi_channel.cc.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/ofi/ofi_channel.h"

namespace rdmaxfer {

namespace {
constexpr uint64_t kOfiShareAlign = 4096;  // striped shares are whole pages
constexpr double kRailDownSendS = 2.0;     // the wait for the stream to tell the peer
}  // namespace

bool OfiChannel::rail_live(size_t rail) const {
  std::lock_guard<std::mutex> lock(mu_);
  return rail < rail_up_.size() && rail_up_[rail] != 0;
}

std::vector<size_t> OfiChannel::live_rails(const std::vector<uint32_t>& keys) const {
  std::vector<size_t> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < rails_.size(); ++i) {
    if (rail_up_[i] != 0 && i < keys.size() && keys[i] != 0) out.push_back(i);
  }
  return out;
}

std::vector<double> OfiChannel::rail_rates(const std::vector<size_t>& live) const {
  std::vector<double> rate = meter_.rates();
  double fastest = 0;
  for (size_t r : live) fastest = std::max(fastest, rate[r]);
  // libfabric reports no link speed every provider fills in: while no rail of `live` is
  // measured, they count alike (equal shares).
  for (size_t r : live) {
    if (rate[r] <= 0) rate[r] = fastest > 0 ? fastest : 1.0;
  }
  return rate;
}

size_t OfiChannel::pick_rail(const std::vector<size_t>& live, const MemoryRegion& local,
                             uint64_t length) const {
  const std::vector<double> rate = rail_rates(live);
  double fastest = 0;
  for (size_t r : live) fastest = std::max(fastest, rate[r]);
  const int home = local.home_rail();
  if (home >= 0 && std::find(live.begin(), live.end(), static_cast<size_t>(home)) != live.end() &&
      rate[static_cast<size_t>(home)] * 2 >= fastest) {
    return static_cast<size_t>(home);
  }
  const std::vector<uint64_t> backlog = meter_.backlogs();
  size_t best = live.front();
  double best_s = -1;
  for (size_t r : live) {
    const double s = static_cast<double>(backlog[r] + length) / rate[r];
    if (best_s < 0 || s < best_s) {
      best = r;
      best_s = s;
    }
  }
  return best;
}

std::vector<std::tuple<size_t, uint64_t, uint64_t>> OfiChannel::shares(
    const std::vector<size_t>& live, uint64_t length) {
  const std::vector<double> all = rail_rates(live);
  std::vector<double> rate;
  for (size_t r : live) rate.push_back(all[r]);
  const std::vector<uint64_t> share =
      meter_.shares(length, live, rate, kOfiShareAlign, RailMeter::Clock::now());
  std::vector<std::tuple<size_t, uint64_t, uint64_t>> out;
  uint64_t at = 0;
  for (size_t i = 0; i < live.size(); ++i) {
    if (share[i] > 0) out.emplace_back(live[i], at, share[i]);
    at += share[i];
  }
  return out;
}

size_t OfiChannel::grant_rail() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < rail_up_.size(); ++i) {
    if (rail_up_[i] != 0) return i;
  }
  throw Error(ErrorKind::kConnection, "endpoint to " + peer_ + ": no rail is live");
}

bool OfiChannel::keep_done(OpKind op, const RequestPtr& request,
                           const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                           uint64_t length, size_t rail, const PartTarget& target) {
  if (rails_.size() < 2 || target.notified) return true;  // no rail to do it again on
  DonePart part{op, request, local, offset, length, target};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rail_up_[rail] != 0) {
      // Not the request's last part (that completes it, with nothing left to do again), and
      // the request not failed: track()'s erase of its parts, also under mu_, comes after.
      if (request->parts_left() > 1 && !request->done()) {
        done_parts_[rail][request->id()].push_back(std::move(part));
      }
      return true;
    }
  }
  redo(part, false);
  return false;
}

void OfiChannel::redo(const DonePart& part, bool again) {
  RequestPtr request = part.request.lock();
  // Nothing to do for a request that failed, or completed meanwhile (too late).
  if (!request || request->done() || (again && !request->add_part())) return;
  PartTarget moved = part.target;
  ++moved.moves;
  moved.counted = moved.counted || again;
  move_part(part.op, request, part.local, part.offset, part.length, moved,
            std::string(part.op == OpKind::kRead ? "READ" : "WRITE") + " with " + peer_ +
                ": a part done on a rail that failed cannot go again: no live rail reaches "
                "the remote memory");
}

void OfiChannel::move_part(OpKind op, const RequestPtr& request,
                           const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                           uint64_t length, const PartTarget& moved, const std::string& no_rail) {
  const std::vector<size_t> rails = live_rails(*moved.keys);
  if (rails.empty()) {
    request->fail(ErrorKind::kConnection, no_rail);
    return;
  }
  try {
    post_part(op, request, local, offset, length, pick_rail(rails, *local, length), moved);
  } catch (const Error& e) {
    request->fail(e);
  }
}

void OfiChannel::test_lost_read(OpKind op, const std::shared_ptr<MemoryRegion>& local,
                                uint64_t offset, uint64_t length, size_t rail,
                                uint64_t carried) {
  if (op != OpKind::kRead || rail != test_lost_rail_ || carried < test_lost_bytes_ ||
      test_lost_fired_.exchange(true)) {
    return;
  }
  std::memset(local->addr() + offset, 0, length);
  rail_failed(rail, "a READ part on it completed without its data (RDMAXFER_OFI_TEST_LOST_READ)",
              true);
}

bool OfiChannel::rail_failed(size_t rail, const std::string& cause, bool tell_peer) {
  const std::string name = rails_[rail].domain->settings().domain;
  bool live = false;
  std::string causes;
  std::unordered_map<uint64_t, std::vector<DonePart>> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool first = rail_up_[rail] != 0;
    rail_up_[rail] = 0;
    if (first) {
      rail_cause_[rail] = cause;
      schedule_heal_locked(rail);
      done.swap(done_parts_[rail]);
    }
    if (closed_) return false;
    for (size_t i = 0; i < rails_.size(); ++i) {
      live = live || rail_up_[i] != 0;
      causes += (causes.empty() ? "" : "; ") + rails_[i].domain->settings().domain + ": " +
                rail_cause_[i];
    }
    if (!first) return live;
  }
  size_t again = 0;
  for (const auto& [id, parts] : done) again += parts.size();
  if (live || rails_.size() > 1) {
    log::write(log::Level::kWarning,
               "ofi endpoint to " + peer_ + ": rail " + name + " failed (" + cause + ")" +
                   (live ? "; its transfers go on the live rails" : "") +
                   (live && again > 0 ? ", with the " + std::to_string(again) +
                                            " part(s) it completed for transfers in flight"
                                      : ""));
  }
  if (tell_peer && live) {
    // Bounded: this runs on a domain's completion thread, which every peer's parts wait on.
    OfiFrameHeader h;
    h.kind = OfiFrameKind::kRailDown;
    h.message.route = static_cast<uint32_t>(rail);
    const std::string meta = cause.substr(0, 1024);
    h.meta_len = static_cast<uint32_t>(meta.size());
    try {
      send_frame(h, meta, nullptr, kRailDownSendS);
    } catch (const Error& e) {
      // The stream is gone too (its reader closes the endpoint), or stuck: the peer learns of
      // the rail from its own failures there.
      log::write(log::Level::kDebug, std::string("ofi: rail down not sent: ") + e.what());
    }
  }
  if (live) {
    for (const auto& [id, parts] : done) {
      for (const DonePart& part : parts) redo(part, true);
    }
  }
  if (live && connector_) transport_.watch_rails();  // asks the rail back (ofi_heal.cc)
  if (!live) {
    abort(ErrorKind::kConnection,
          "connection to " + peer_ + " lost: " +
              (rails_.size() == 1 ? cause : "every rail failed (" + causes + ")"));
  }
  return live;
}

std::string OfiChannel::rails_text() const {
  const std::vector<double> rates = meter_.rates();
  const std::vector<uint32_t> share = meter_.last_share_pct();
  std::string s;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < rails_.size(); ++i) {
    const std::string rejoined =
        heal_[i].rejoins == 0 ? "" : " (rejoined " + std::to_string(heal_[i].rejoins) +
                                         "x, last failure: " + rail_cause_[i] + ")";
    s += (s.empty() ? "" : "; ") + rails_[i].domain->settings().domain +
         (rail_up_[i] != 0 ? " up" + rejoined : " failed (" + rail_cause_[i] + ")") + ", " +
         std::to_string(rail_bytes_[i].load()) + " bytes, " + rate_text(rates[i]) + ", " +
         std::to_string(share[i]) + "% of the last striped transfer";
  }
  return s;
}

std::string OfiChannel::describe() const {
  return "to " + peer_ + " over libfabric " + domain_->settings().provider + " (" +
         (rails_.size() == 1 ? domain_->settings().domain : "rails: " + rails_text()) + ")";
}

std::vector<std::pair<std::string, uint64_t>> OfiChannel::attributes() const {
  std::vector<std::pair<std::string, uint64_t>> out = {
      {"max_message", max_chunk_}, {"notify_chunk", notify_chunk_},
      {"inject_size", domain_->settings().inject_size},
      {"cq_data_size", domain_->settings().cq_data_size},
      {"hmem", domain_->settings().hmem ? 1 : 0}, {"rails", rails_.size()}};
  const std::vector<double> rates = meter_.rates();
  const std::vector<uint32_t> share = meter_.last_share_pct();
  for (size_t i = 0; i < rails_.size(); ++i) {
    const std::string key = "rail_" + rails_[i].domain->settings().domain;
    out.emplace_back(key + "_bytes", rail_bytes_[i].load());
    out.emplace_back(key + "_up", rail_live(i) ? 1 : 0);
    out.emplace_back(key + "_rate", static_cast<uint64_t>(rates[i]));
    out.emplace_back(key + "_share_pct", share[i]);
    std::lock_guard<std::mutex> lock(mu_);
    out.emplace_back(key + "_rejoins", heal_[i].rejoins);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> OfiChannel::names() const {
  const OfiSettings& s = domain_->settings();
  std::string domains;
  for (const OfiPeerRail& r : rails_) {
    domains += (domains.empty() ? "" : ",") + r.domain->settings().domain;
  }
  return {{"provider", s.provider}, {"fabric", s.fabric}, {"domain", s.domain},
          {"domains", domains}};
}

}  // namespace rdmaxfer

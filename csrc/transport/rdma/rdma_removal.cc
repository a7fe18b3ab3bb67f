// RdmaTransport: a rail's device removed (rdma_transport.h, "Device removal"). The watch thread
// notices it (ibv_get_device_list, or IBV_EVENT_DEVICE_FATAL), fails it over and releases every
// handle the engine holds on it, so the kernel's unregistration of the device can finish; when
// the device is listed again it opens it again (readd_rail). Each period it also lets every
// connection heal its failed rails (rdma_healing.cc).
#include <algorithm>
#include <chrono>
#include <cstdint>

#include "common/error.h"
#include "common/log.h"
#include "transport/rdma/rdma_transport.h"

namespace rdmaxfer {

namespace {
// How often the watch lists the devices: one ibv_get_device_list (an RDMA netlink dump and a
// few sysfs reads) per period, for the whole engine.
constexpr auto kRailCheck = std::chrono::milliseconds(500);
}  // namespace

void RdmaTransport::start_rail_watch() {
  fatal_.assign(rails_.size(), "");
  // One rail: nothing to fail over to (its connections close on the device's errors).
  if (rails_.size() < 2) return;
  watch_ = std::thread([this] { watch_rails(); });
}

void RdmaTransport::stop_rail_watch() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watch_.joinable()) watch_.join();
}

void RdmaTransport::device_fatal(int rail, const std::string& cause) {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    fatal_[static_cast<size_t>(rail)] = cause;
  }
  watch_cv_.notify_all();
}

bool RdmaTransport::rail_removed(size_t rail) const {
  std::lock_guard<std::mutex> lock(mu_);
  return !rails_[rail].removed.empty();
}

void RdmaTransport::watch_rails() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_stop_) {
    watch_cv_.wait_for(lock, kRailCheck, [this] {
      return watch_stop_ ||
             std::any_of(fatal_.begin(), fatal_.end(), [](const auto& f) { return !f.empty(); });
    });
    if (watch_stop_) break;
    std::vector<std::pair<int, std::string>> gone;
    for (size_t r = 0; r < fatal_.size(); ++r) {
      if (!fatal_[r].empty()) gone.emplace_back(static_cast<int>(r), std::move(fatal_[r]));
      fatal_[r].clear();
    }
    lock.unlock();
    std::vector<std::string> listed;
    bool listing = true;
    try {
      listed = DeviceContext::listed_devices();
    } catch (const Error& e) {
      listing = false;  // no conclusion from a failed listing: try again next period
      log::write(log::Level::kDebug, std::string("rdma rail watch: ") + e.what());
    }
    for (size_t r = 0; listing && r < rails_.size(); ++r) {
      const std::string& name = rails_[r].name;  // never changes
      if (std::find(listed.begin(), listed.end(), name) != listed.end()) {
        if (rail_removed(r)) readd_rail(r);
        continue;
      }
      if (std::any_of(gone.begin(), gone.end(), [r](const auto& g) {
            return g.first == static_cast<int>(r);
          })) {
        continue;
      }
      gone.emplace_back(static_cast<int>(r),
                        "device " + name + " was removed (ibv_get_device_list no longer lists "
                        "it: its driver is unregistering it, e.g. rdma link delete)");
    }
    for (const auto& [rail, cause] : gone) remove_rail(rail, cause);
    for (const auto& c : live_connections()) c->heal_tick();
    lock.lock();
  }
}

PdList RdmaTransport::current_pds() const {
  std::lock_guard<std::mutex> lock(regions_mu_);
  return pds_;
}

void RdmaTransport::track(const std::shared_ptr<RdmaRegion>& region) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  // A rail removed since its PDs were taken: that MR goes now; one whose device came back
  // since: an MR in its new PD (none for GPU memory, whose dmabuf fd is gone).
  for (size_t r = 0; r < pds_.size(); ++r) {
    if (!pds_[r]) {
      region->drop_rail(r);
    } else if (region->lkey_on(r) == 0) {
      region->add_rail(r, pds_[r]);
    }
  }
  if (regions_.size() >= prune_at_) {
    regions_.erase(std::remove_if(regions_.begin(), regions_.end(),
                                  [](const auto& w) { return w.expired(); }),
                   regions_.end());
    prune_at_ = std::max<size_t>(64, 2 * regions_.size());
  }
  regions_.push_back(region);
}

void RdmaTransport::remove_rail(int rail, const std::string& cause) {
  const size_t r = static_cast<size_t>(rail);
  std::shared_ptr<CqPoller> poller;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_ || !rails_[r].removed.empty()) return;
    rails_[r].removed = cause;  // no new connection uses it (prepare, connect, pair_rails)
    poller = rails_[r].poller;
  }
  log::write(log::Level::kWarning, "rdma: rail " + rails_[r].name + " removed (" + cause +
                                       "): failing it over and releasing its device");
  const std::vector<std::shared_ptr<RdmaConnection>> conns = live_connections();
  for (const auto& c : conns) c->rail_down(rail, cause);
  // None of its handlers runs again (nor a caller's progress() on it) before its connections
  // let go of the rail.
  poller->stop();
  poller.reset();
  release_handles(rail, cause, conns);
}

void RdmaTransport::release_handles(int rail, const std::string& cause,
                                    const std::vector<std::shared_ptr<RdmaConnection>>& conns) {
  const size_t r = static_cast<size_t>(rail);
  for (const auto& c : conns) c->release_rail(rail, cause);
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    pds_[r].reset();
    for (const auto& w : regions_) {
      if (auto region = w.lock()) region->drop_rail(r);
    }
  }
  Rail dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped = rails_[r].take_handles();
  }
  const std::weak_ptr<DeviceContext> context = dropped.context;
  dropped = Rail{};
  if (context.expired()) {
    log::write(log::Level::kInfo, "rdma: released every handle on " + rails_[r].name);
  } else {
    log::write(log::Level::kWarning,
               "rdma: " + rails_[r].name + " is still held (" +
                   std::to_string(context.use_count()) +
                   " owner(s) of its context left, e.g. a connection being set up); its "
                   "unregistration waits until they go");
  }
}

void RdmaTransport::readd_rail(size_t r) {
  // The generation is a u16 in descriptors: after 65,535 returns a device stays out (a new
  // Engine starts again from 0).
  if (generation_.load() == UINT16_MAX) return;
  Rail back;
  back.name = rails_[r].name;
  std::vector<std::shared_ptr<RdmaRegion>> regions;
  try {
    back.context = DeviceContext::open(back.name, config_.port, config_.gid_index);
    back.record = rail_record(*back.context);
    EndpointRecord::Rail before;
    {
      std::lock_guard<std::mutex> lock(mu_);
      before = rails_[r].record;
    }
    // rxe lists a device before its netdev's addresses are in its GID table: wait for the IPv4
    // GID the rail had rather than come back on a link-local one.
    if (gid_is_ipv4(before.gid) && !gid_is_ipv4(back.record.gid)) return;
    open_handles(back, static_cast<int>(r));
  } catch (const Error& e) {
    log::write(log::Level::kDebug, "rdma: " + back.name + " is listed again but cannot be "
                                       "opened yet (" + e.what() + "); trying again");
    return;
  }
  // Every live registration gets an MR in the new PD; new ones get it from pds_ (track).
  size_t failed = 0;
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    pds_[r] = back.pd;
    for (const auto& w : regions_) {
      auto region = w.lock();
      if (!region) continue;
      try {
        region->add_rail(r, back.pd);
      } catch (const Error& e) {
        if (failed++ == 0) {
          log::write(log::Level::kWarning, "rdma: a registration has no MR on " + back.name +
                                               " after it came back (" + e.what() + ")");
        }
      }
    }
  }
  // After the MRs: a descriptor that reads this generation reads their keys (transport.cc).
  back.record.generation = static_cast<uint16_t>(generation_.fetch_add(1) + 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    back.returns = rails_[r].returns + 1;
    rails_[r].adopt_handles(back);
    rails_[r].removed.clear();
    qp_tags_[r].clear();
  }
  back.poller->start();  // its handlers read rails_[r]
  log::write(log::Level::kWarning,
             "rdma: rail " + back.name + " is back (its device was added again): " +
                 std::to_string(failed) + " registration(s) without an MR there; connections "
                 "rejoin over it");
  const int per_qp = static_cast<int>(settings_.limits.sq_depth + settings_.ctrl_depth);
  for (const auto& c : live_connections()) {
    const int n = c->qps_on(static_cast<int>(r));
    if (n == 0 || c->is_closed()) continue;
    try {
      if (!c->rail_back(static_cast<int>(r), back, back.cqs->reserve(c->tag(), n * per_qp))) {
        continue;
      }
    } catch (const Error& e) {
      log::write(log::Level::kWarning, "rdma endpoint to " + c->peer() + ": rail " + back.name +
                                           " stays out (" + e.what() + ")");
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [rail, qpn] : c->qp_numbers()) {
      if (static_cast<size_t>(rail) == r) qp_tags_[r][qpn] = c->tag();
    }
  }
}

}  // namespace rdmaxfer

// OfiChannel: a failed rail rejoins the endpoint, with no call from the user.
//
// A rail fails over when one of its parts fails with a connection or transport error
// (ofi_channel.cc); the peer is told (RAIL_DOWN). The provider may keep what failed: over
// verbs;ofi_rxm the rail's connection to the peer (an RC QP) stays in error, and every later
// operation to that peer's AV entry is flushed, even from a new endpoint. So a rail comes back
// only through a new entry, with FI_AV_REMOVE_CLEANUP set (ofi_api.cc) so that removing the
// old one releases the provider's connection. The connecting side drives it, from the
// transport's rail watch (heal_tick):
//   1. After the backoff it renews its entry for the peer on the rail (fi_av_remove, then
//      fi_av_insert of the peer's address; not when another endpoint to the same peer, which
//      shares the entry, renewed it since the rail failed) and sends REJOIN with its probe
//      word: where it is (fabric address, the key on that rail) and its value, random per
//      endpoint.
//   2. The acceptor renews its entry for the connector on the rail (the same way) and READs
//      the probe word
//      over it (the provider sets up a new connection). The value right, it answers REJOIN_OK
//      with its own probe word; else REJOIN_NO with why.
//   3. The connector READs the acceptor's probe word over the rail. The value right, the rail
//      is live again and RAIL_UP tells the acceptor, whose rail is live from then on.
// A live rail has its rate forgotten (it counts as not measured yet), so the next striped
// transfer gives it a share and measures it. An attempt that fails (REJOIN_NO, a probe that
// fails or reads another value, no answer within kOfiHealAnswerS) is tried again after the
// backoff, which doubles from 1 s up to kOfiHealMaxS; a rail that fails again within kOfiFlapS
// of rejoining keeps doubling rather than starting over.
#include <cstring>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "common/random.h"
#include "transport/ofi/ofi_channel.h"
#include "transport/ofi/ofi_transport.h"

namespace rdmaxfer {

namespace {
constexpr double kOfiHealMaxS = 60.0;
constexpr double kOfiFlapS = 30.0;
// The connector's wait for REJOIN_OK: the acceptor's probe sets up a provider connection first
// (seconds under an emulated NIC).
constexpr double kOfiHealAnswerS = 10.0;
constexpr double kOfiHealSendS = 2.0;        // the wait for the stream to take a rejoin frame
constexpr uint64_t kOfiProbeBytes = 4096;    // the probe word's region: one page
constexpr uint64_t kOfiProbeLandAt = 64;     // where this side's probes land, 8 bytes per rail

OfiChannel::Clock::time_point heal_after(double seconds) {
  return OfiChannel::Clock::now() + std::chrono::duration_cast<OfiChannel::Clock::duration>(
                                        std::chrono::duration<double>(seconds));
}
}  // namespace

void OfiChannel::schedule_heal_locked(size_t rail) {
  RailHeal& h = heal_[rail];
  const bool flapped =
      h.rejoins > 0 && Clock::now() - h.healed_at < std::chrono::duration<double>(kOfiFlapS);
  h.backoff_s =
      flapped ? std::min(kOfiHealMaxS, std::max(heal_first_s_, h.backoff_s * 2)) : heal_first_s_;
  h.next_try = heal_after(h.backoff_s);
  h.asking = false;
  h.renewals = rails_[rail].peer->renewals();
}

void OfiChannel::renew_peer(size_t rail) {
  uint64_t seen = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seen = heal_[rail].renewals;
  }
  const OfiPeerRail& r = rails_[rail];
  if (r.peer->renewals() != seen) return;  // another endpoint renewed it since
  r.domain->renew(*r.peer);
  std::lock_guard<std::mutex> lock(mu_);
  heal_[rail].renewals = r.peer->renewals();  // a later attempt renews it again
}

void OfiChannel::heal_tick() {
  std::vector<std::pair<size_t, uint64_t>> ask;
  std::vector<std::pair<size_t, uint64_t>> late;
  // A rail with operations still in flight to the peer (from any endpoint: they share its AV
  // entry) waits for them: renewing the entry could drop their completions.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !connector_) return;
    const Clock::time_point now = Clock::now();
    for (size_t r = 0; r < rails_.size(); ++r) {
      RailHeal& h = heal_[r];
      if (rail_up_[r] != 0) continue;
      if (h.asking) {
        if (now > h.deadline) late.emplace_back(r, h.attempt);
      } else if (now >= h.next_try && rails_[r].peer->in_flight() == 0) {
        h.asking = true;
        h.deadline = heal_after(kOfiHealAnswerS);
        ask.emplace_back(r, ++h.attempt);
      }
    }
  }
  for (const auto& [rail, attempt] : late) {
    heal_failed(rail, attempt,
                "no answer within " + std::to_string(static_cast<int>(kOfiHealAnswerS)) + " s");
  }
  for (const auto& [rail, attempt] : ask) {
    try {
      renew_peer(rail);
    } catch (const Error& e) {
      heal_failed(rail, attempt, e.what());
      continue;
    }
    if (!send_heal(OfiFrameKind::kRejoin, rail, attempt, "")) {
      heal_failed(rail, attempt, "the control stream did not take REJOIN");
    }
  }
}

void OfiChannel::on_heal_frame(const OfiFrameHeader& h, const std::string& meta) {
  const size_t rail = h.message.route;
  const uint64_t attempt = h.message.msg_id;
  if (rail >= rails_.size() || rails_.size() < 2) return;  // not a rail of this endpoint
  std::weak_ptr<OfiChannel> weak = weak_from_this();
  switch (h.kind) {
    case OfiFrameKind::kRejoin: {
      if (connector_) return;  // only the connecting side asks
      if (rail_live(rail)) rail_failed(rail, "the peer's end failed and asks it back", false);
      if (rails_[rail].peer->in_flight() != 0) {
        send_heal(OfiFrameKind::kRejoinNo, rail, attempt, "operations are still in flight on it");
        return;
      }
      try {
        renew_peer(rail);
        probe(rail, h.message.addr, h.message.key, h.message.size,
              [weak, rail, attempt](const std::string& why) {
                auto self = weak.lock();
                if (!self) return;
                if (!why.empty()) {
                  self->send_heal(OfiFrameKind::kRejoinNo, rail, attempt, why);
                  return;
                }
                {
                  std::lock_guard<std::mutex> lock(self->mu_);
                  self->heal_[rail].attempt = attempt;
                  self->heal_[rail].asking = true;  // live once RAIL_UP comes
                }
                self->send_heal(OfiFrameKind::kRejoinOk, rail, attempt, "");
              });
      } catch (const Error& e) {
        send_heal(OfiFrameKind::kRejoinNo, rail, attempt, e.what());
      }
      return;
    }
    case OfiFrameKind::kRejoinOk: {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!connector_ || !heal_[rail].asking || heal_[rail].attempt != attempt) return;
      }
      try {
        probe(rail, h.message.addr, h.message.key, h.message.size,
              [weak, rail, attempt](const std::string& why) {
                auto self = weak.lock();
                if (!self) return;
                if (!why.empty()) {
                  self->heal_failed(rail, attempt, why);
                  return;
                }
                self->rail_rejoined(rail, attempt);
                self->send_heal(OfiFrameKind::kRailUp, rail, attempt, "");
              });
      } catch (const Error& e) {
        heal_failed(rail, attempt, e.what());
      }
      return;
    }
    case OfiFrameKind::kRejoinNo:
      if (connector_) heal_failed(rail, attempt, "the peer: " + peer_text(meta));
      return;
    case OfiFrameKind::kRailUp:
      if (!connector_) rail_rejoined(rail, attempt);
      return;
    default:
      return;
  }
}

void OfiChannel::heal_failed(size_t rail, uint64_t attempt, const std::string& why) {
  double backoff = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    RailHeal& h = heal_[rail];
    if (!h.asking || h.attempt != attempt) return;
    h.asking = false;
    h.backoff_s = std::min(kOfiHealMaxS, std::max(heal_first_s_, h.backoff_s * 2));
    h.next_try = heal_after(h.backoff_s);
    backoff = h.backoff_s;
  }
  log::write(log::Level::kDebug, "ofi endpoint to " + peer_ + ": rail " +
                                     rails_[rail].domain->settings().domain +
                                     " did not rejoin (" + why + "); next try in " +
                                     std::to_string(static_cast<int>(backoff)) + " s");
}

void OfiChannel::rail_rejoined(size_t rail, uint64_t attempt) {
  std::string cause;
  {
    std::lock_guard<std::mutex> lock(mu_);
    RailHeal& h = heal_[rail];
    if (closed_ || !h.asking || h.attempt != attempt || rail_up_[rail] != 0) return;
    h.asking = false;
    ++h.rejoins;
    h.healed_at = Clock::now();
    cause = rail_cause_[rail];
    meter_.forget(rail);  // counts as not measured: the next striped transfer measures it
    rail_up_[rail] = 1;
  }
  log::write(log::Level::kInfo, "ofi endpoint to " + peer_ + ": rail " +
                                    rails_[rail].domain->settings().domain +
                                    " rejoined (it had failed: " + cause + ")");
}

std::shared_ptr<MemoryRegion> OfiChannel::probe_word() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!probe_) {
    probe_ = transport_.probe_region(kOfiProbeBytes);
    while (probe_value_ == 0) probe_value_ = random_u64();
    std::memcpy(probe_->addr(), &probe_value_, sizeof(probe_value_));
  }
  return probe_;
}

void OfiChannel::probe(size_t rail, uint64_t addr, uint32_t key, uint64_t expect,
                       std::function<void(const std::string&)> then) {
  const std::shared_ptr<MemoryRegion> word = probe_word();
  uint8_t* land = word->addr() + kOfiProbeLandAt + sizeof(uint64_t) * rail;
  std::memset(land, 0, sizeof(uint64_t));
  auto op = std::make_unique<OfiOp>();
  op->hold = RegionUse(word);
  op->done = [land, expect, then](int err, int, const std::string& text) {
    if (err != 0) {
      then("the probe READ failed: " + text);
      return;
    }
    uint64_t got = 0;
    std::memcpy(&got, land, sizeof(got));
    then(got == expect ? "" : "the probe READ completed with other bytes than the peer's word");
  };
  // Bounded: the provider sets up its connection to the peer on this READ (FI_EAGAIN until
  // then), on the stream's reader thread, and the connector waits kOfiHealAnswerS for the answer.
  std::weak_ptr<OfiChannel> weak = weak_from_this();
  const Clock::time_point deadline = heal_after(kOfiHealAnswerS);
  auto give_up = [weak, deadline] {
    auto self = weak.lock();
    return !self || self->is_closed() || Clock::now() > deadline;
  };
  void* desc = ofi_region(word, "probe READ").desc(rail);
  rails_[rail].domain->post_read(std::move(op), land, sizeof(uint64_t), desc,
                                 rails_[rail].peer, addr, key, give_up);
}

bool OfiChannel::send_heal(OfiFrameKind kind, size_t rail, uint64_t attempt,
                           const std::string& why) {
  OfiFrameHeader h;
  h.kind = kind;
  h.message.route = static_cast<uint32_t>(rail);
  h.message.msg_id = attempt;
  std::string meta;
  try {
    if (kind == OfiFrameKind::kRejoin || kind == OfiFrameKind::kRejoinOk) {
      const std::shared_ptr<MemoryRegion> word = probe_word();
      // Without FI_MR_VIRT_ADDR a remote address is the offset from the region's start.
      h.message.addr =
          domain_->settings().mr_virt_addr ? reinterpret_cast<uint64_t>(word->addr()) : 0;
      h.message.key = ofi_region(word, "probe word").key_on(rail);
      h.message.size = probe_value_;
    } else if (kind == OfiFrameKind::kRejoinNo) {
      meta = why.substr(0, 1024);
    }
    h.meta_len = static_cast<uint32_t>(meta.size());
    send_frame(h, meta, nullptr, kOfiHealSendS);
    return true;
  } catch (const Error& e) {
    log::write(log::Level::kDebug, std::string("ofi: rejoin message not sent: ") + e.what());
    return false;
  }
}

}  // namespace rdmaxfer

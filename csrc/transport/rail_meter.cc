#include "transport/rail_meter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace rdmaxfer {

std::vector<uint64_t> water_fill(uint64_t length, const std::vector<double>& rate,
                                 const std::vector<uint64_t>& backlog, uint64_t align) {
  const size_t n = rate.size();
  std::vector<uint64_t> share(n, 0);
  if (n == 0) return share;
  // The rails by when their backlog drains; the first k of them share the transfer, for the
  // largest k whose finish time T comes after the k-th one's backlog drained.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  auto drain = [&](size_t i) { return static_cast<double>(backlog[i]) / rate[i]; };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return drain(a) < drain(b); });
  double bytes = static_cast<double>(length);
  double rates = 0;
  double finish = 0;
  size_t k = 0;
  for (; k < n; ++k) {
    const size_t i = order[k];
    const double t = (bytes + static_cast<double>(backlog[i])) / (rates + rate[i]);
    if (k > 0 && t <= drain(i)) break;  // rail i would still be busy when the others finish
    bytes += static_cast<double>(backlog[i]);
    rates += rate[i];
    finish = t;
  }
  uint64_t given = 0;
  size_t largest = order[0];
  for (size_t j = 0; j < k; ++j) {
    const size_t i = order[j];
    const double want = std::max(0.0, finish * rate[i] - static_cast<double>(backlog[i]));
    uint64_t s = static_cast<uint64_t>(want) / align * align;
    s = std::min(s, length - given);
    share[i] = s;
    given += s;
    if (share[i] > share[largest]) largest = i;
  }
  share[largest] += length - given;
  return share;
}

std::vector<double> share_rates(const std::vector<double>& rate) {
  double fastest = 0;
  for (double r : rate) fastest = std::max(fastest, r);
  std::vector<double> out;
  out.reserve(rate.size());
  for (double r : rate) out.push_back(fastest > 0 ? r * std::min(1.0, 0.5 + r / fastest) : r);
  return out;
}

std::string rate_text(double bytes_per_s) {
  if (bytes_per_s <= 0) return "rate not measured yet";
  char text[48];
  std::snprintf(text, sizeof(text), "%.1f MB/s", bytes_per_s / 1e6);
  return text;
}

RailMeter::RailMeter(size_t rails) : meters_(rails) {}

void RailMeter::posted(size_t rail, uint64_t bytes, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Meter& m = meters_.at(rail);
  if (m.outstanding == 0) m.since = now;
  m.outstanding += bytes;
}

void RailMeter::completed(size_t rail, uint64_t bytes, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Meter& m = meters_.at(rail);
  if (m.outstanding == 0) return;  // dropped meanwhile (failover): not a sample
  const double dt = std::chrono::duration<double>(now - m.since).count();
  m.outstanding -= std::min(m.outstanding, bytes);
  m.since = now;
  if (dt <= 0) return;  // the clock did not move: no sample
  const double keep =
      m.seconds > 0 ? std::exp(-std::chrono::duration<double>(now - m.last).count() / kRateTau)
                    : 0.0;
  m.bytes = m.bytes * keep + static_cast<double>(bytes);
  m.seconds = m.seconds * keep + dt;
  m.last = now;
}

void RailMeter::unposted(size_t rail, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Meter& m = meters_.at(rail);
  m.outstanding -= std::min(m.outstanding, bytes);
}

void RailMeter::forget(size_t rail) {
  std::lock_guard<std::mutex> lock(mu_);
  Meter& m = meters_.at(rail);
  m.outstanding = 0;
  m.bytes = 0;
  m.seconds = 0;
  m.last = Clock::time_point{};
}

std::vector<double> RailMeter::rates() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> out;
  out.reserve(meters_.size());
  for (const Meter& m : meters_) out.push_back(m.seconds > 0 ? m.bytes / m.seconds : 0.0);
  return out;
}

std::vector<uint64_t> RailMeter::backlogs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> out;
  out.reserve(meters_.size());
  for (const Meter& m : meters_) out.push_back(m.outstanding);
  return out;
}

std::vector<uint64_t> RailMeter::shares(uint64_t length, const std::vector<size_t>& rails,
                                        const std::vector<double>& rate, uint64_t align,
                                        Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> backlog;
  for (size_t r : rails) backlog.push_back(meters_.at(r).outstanding);
  std::vector<double> by = share_rates(rate);
  std::vector<uint64_t> share = water_fill(length, by, backlog, align);
  const size_t largest =
      static_cast<size_t>(std::max_element(share.begin(), share.end()) - share.begin());
  bool dropped = false;
  for (size_t k = 0; k < rails.size(); ++k) {
    const Meter& m = meters_[rails[k]];
    const double age = std::chrono::duration<double>(now - m.last).count();
    const bool probe = m.seconds > 0 && age >= kProbeS;
    if (k != largest && share[k] > 0 &&
        static_cast<double>(share[k]) < kMinShare * static_cast<double>(length) && !probe) {
      by[k] = 0;
      dropped = true;
    }
  }
  if (dropped) {
    // Shared again among the others (a rail with no rate left gets nothing).
    std::vector<size_t> kept;
    std::vector<double> kept_rate;
    std::vector<uint64_t> kept_backlog;
    for (size_t k = 0; k < rails.size(); ++k) {
      if (by[k] == 0) continue;
      kept.push_back(k);
      kept_rate.push_back(by[k]);
      kept_backlog.push_back(backlog[k]);
    }
    const std::vector<uint64_t> again = water_fill(length, kept_rate, kept_backlog, align);
    share.assign(rails.size(), 0);
    for (size_t j = 0; j < kept.size(); ++j) share[kept[j]] = again[j];
  }
  for (Meter& m : meters_) m.last_share = 0;
  for (size_t k = 0; k < rails.size(); ++k) meters_[rails[k]].last_share = share[k];
  return share;
}

std::vector<uint32_t> RailMeter::last_share_pct() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const Meter& m : meters_) total += m.last_share;
  std::vector<uint32_t> out;
  out.reserve(meters_.size());
  for (const Meter& m : meters_) {
    out.push_back(total == 0 ? 0
                             : static_cast<uint32_t>(std::llround(
                                   100.0 * static_cast<double>(m.last_share) /
                                   static_cast<double>(total))));
  }
  return out;
}

}  // namespace rdmaxfer

// What each rail of a connection delivers now, and how a striped transfer's bytes are shared
// among the rails by it (adaptive striping). Used by every transport with rails: verbs
// (transport/rdma/rdma_striping.cc) and libfabric (transport/ofi/ofi_rails.cc).
//
// Rate: measured from the connection's own completions (of WRs, or of libfabric operations)
// while the rail is busy. A rail is
// busy from the moment bytes are posted on it with none outstanding until its outstanding bytes
// are all completed; each completion of `b` bytes `dt` seconds after the previous one (or after
// the rail went busy) is a sample b/dt. The samples are averaged with a time decay: bytes and
// seconds are both summed, the earlier sums weighted by exp(-t / kRateTau) where t is the wall
// time since the previous sample, so the rate is what the rail moved over its last ~kRateTau
// seconds, and a rail that slows down or recovers shows it on the next transfer. The measure is the throughput the rail delivers to this
// connection, whatever limits it (link speed, a congested switch port, PFC pauses, a NIC
// across a socket, a rate limit), not the port's nominal speed.
//
// Share: a striped transfer is split so that every rail finishes at the same time given what
// is already queued on it (water filling): rail r gets max(0, T * rate_r - backlog_r) bytes
// for the T at which the shares add up to the transfer. A rail not yet measured counts at the
// fastest measured rate (so it is measured at once), or, while none is, at its port's speed.
// Every rail with no backlog therefore gets a share and keeps being measured: a rail that
// recovers wins its share back on the next transfers. A rail much slower than the fastest is
// counted at less than its rate (share_rates): a shortfall on it delays the whole transfer by
// as much as its share took, while its share adds little, so its share is kept on the safe
// side (measured in the rxe guest: a rail throttled to 1/20 delivered between 0.4 and 0.9 of
// its throttle from one transfer to the next, as rxe retransmitted). (TENT and
// Mooncake's transfer engine spray slices by per-rail load the same way; NCCL splits by
// nominal bandwidth.)
//
// A rail whose share comes below kMinShare of a transfer is left out of it: what it would add
// is smaller than what driving it costs (measured in the rxe guest: a rail throttled to 1/20
// taking 2 % of a 16 MiB WRITE slowed the other rail by a third, as rxe retransmitted on it).
// It is measured again, with its share, once its last sample is kProbeS old, so a rail that
// recovers comes back within about that long.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace rdmaxfer {

// How fast a rail's rate estimate forgets (seconds).
constexpr double kRateTau = 0.5;
// The smallest share of a striped transfer a rail is given (fraction), and how old its last
// sample may be before it is given its share anyway (seconds).
constexpr double kMinShare = 0.05;
constexpr double kProbeS = 5.0;

// The bytes each rail gets of a transfer of `length` bytes, by water filling (see above):
// `rate[i]` in bytes/s (> 0), `backlog[i]` the bytes queued on it now. Shares are multiples of
// `align` bytes except the largest, which takes the remainder; they add up to `length`.
std::vector<uint64_t> water_fill(uint64_t length, const std::vector<double>& rate,
                                 const std::vector<uint64_t>& backlog, uint64_t align);

// "812.5 MB/s" for a measured rate (bytes/s), "rate not measured yet" for 0.
std::string rate_text(double bytes_per_s);

// The rates water_fill shares by: each rail's `rate` times min(1, 0.5 + rate / fastest), so
// rails at least half as fast as the fastest count in full and a rail at 1/20 of it at 0.55.
std::vector<double> share_rates(const std::vector<double>& rate);

class RailMeter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RailMeter(size_t rails);

  // `bytes` of payload posted on / completed on rail `rail` at `now`.
  void posted(size_t rail, uint64_t bytes, Clock::time_point now);
  void completed(size_t rail, uint64_t bytes, Clock::time_point now);
  // `bytes` counted by posted() were not posted after all (the lane refused them), or moved
  // off the rail (failover).
  void unposted(size_t rail, uint64_t bytes);
  // Drops `rail`'s rate and backlog: it rejoined after a failure on new QPs (endpoints), with
  // nothing queued on them, and what it delivered while failing says nothing of now. Until its
  // next sample it counts as not measured (see above). Bytes of the failed rail's WRs that
  // were neither completed nor moved off it (a failed request's) would otherwise stay counted
  // as its backlog and keep its share at 0.
  void forget(size_t rail);
  // The measured rate (bytes/s; 0 until a sample) and the bytes outstanding, per rail.
  std::vector<double> rates() const;
  std::vector<uint64_t> backlogs() const;
  // The bytes each of `rails` (meter indices) gets of a striped transfer of `length` bytes:
  // water_fill by share_rates of `rate` (bytes/s, > 0, one per entry of `rails`) and the
  // rails' backlogs, less the rails under kMinShare that need no probe (see above). Recorded
  // as the last share.
  std::vector<uint64_t> shares(uint64_t length, const std::vector<size_t>& rails,
                               const std::vector<double>& rate, uint64_t align,
                               Clock::time_point now);
  // The share of the last striped transfer, in percent (0 for a rail it did not use).
  std::vector<uint32_t> last_share_pct() const;

 private:
  struct Meter {
    uint64_t outstanding = 0;
    Clock::time_point since{};  // the last completion, or when the rail went busy
    Clock::time_point last{};   // the last sample
    double bytes = 0;           // decayed sums of the samples
    double seconds = 0;
    uint64_t last_share = 0;
  };
  mutable std::mutex mu_;
  std::vector<Meter> meters_;
};

}  // namespace rdmaxfer

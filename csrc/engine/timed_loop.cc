#include "engine/timed_loop.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <string>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "common/error.h"
#include "protocol/connection.h"

namespace rdmaxfer {

namespace {
using Clock = std::chrono::steady_clock;

// Timestamps in ticks: the TSC on x86, as perftest reads it (in a VM whose clocksource is an
// emulated HPET, every clock_gettime costs microseconds), converted to seconds at the end with a
// rate measured against steady_clock over the whole loop; steady_clock nanoseconds elsewhere.
inline uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
#endif
}

RequestPtr post(Connection& conn, const TimedLoopSpec& s) {
  TransferOptions options;
  if (s.op == OpKind::kWrite) {
    return conn.post_write(s.local, s.local_offset, s.remote, s.remote_offset, s.length, options);
  }
  return conn.post_read(s.local, s.local_offset, s.remote, s.remote_offset, s.length, options);
}

void finish(const RequestPtr& req, const TimedLoopSpec& s) {
  const int spin = s.inflight > 1 ? std::min(s.spin_us, s.pipeline_spin_us) : s.spin_us;
  if (!req->wait_for(s.timeout_s, spin)) {
    throw Error(ErrorKind::kTimeout, std::string("timed_loop: ") + op_kind_name(s.op) + " of " +
                                         std::to_string(s.length) + " bytes did not complete within " +
                                         std::to_string(s.timeout_s) + " s");
  }
  req->rethrow();
}

// Posts `count` operations keeping up to `inflight` posted; calls on_done(ticks) as each oldest
// one completes (in posting order).
template <typename OnDone>
void run_phase(Connection& conn, const TimedLoopSpec& s, uint64_t count, OnDone on_done) {
  std::deque<RequestPtr> posted;
  uint64_t next = 0;
  while (next < count || !posted.empty()) {
    while (next < count && posted.size() < s.inflight) {
      posted.push_back(post(conn, s));
      ++next;
    }
    finish(posted.front(), s);
    on_done(ticks());
    posted.pop_front();
  }
}
}  // namespace

std::vector<double> timed_loop(Connection& conn, const TimedLoopSpec& spec) {
  if (spec.op != OpKind::kWrite && spec.op != OpKind::kRead) {
    throw Error(ErrorKind::kInvalidArgument, "timed_loop: op must be WRITE or READ");
  }
  if (spec.iters == 0) throw Error(ErrorKind::kInvalidArgument, "timed_loop: iters must be >= 1");
  if (spec.inflight == 0) {
    throw Error(ErrorKind::kInvalidArgument, "timed_loop: inflight must be >= 1");
  }
  if (!spec.local) throw Error(ErrorKind::kInvalidArgument, "timed_loop: no local region");
  if (spec.warmup > 0) run_phase(conn, spec, spec.warmup, [](uint64_t) {});

  std::vector<uint64_t> spans;  // ticks per timed operation
  spans.reserve(spec.iters);
  const Clock::time_point wall0 = Clock::now();
  const uint64_t tick0 = ticks();
  if (spec.inflight == 1) {
    for (uint64_t i = 0; i < spec.iters; ++i) {
      const uint64_t t0 = ticks();
      RequestPtr req = post(conn, spec);
      finish(req, spec);
      spans.push_back(ticks() - t0);
    }
  } else {
    uint64_t last = tick0;
    run_phase(conn, spec, spec.iters, [&](uint64_t now) {
      spans.push_back(now - last);
      last = now;
    });
  }
  const uint64_t tick1 = ticks();
  const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
  const double seconds_per_tick =
      tick1 > tick0 && wall > 0 ? wall / static_cast<double>(tick1 - tick0) : 0.0;
  std::vector<double> out;
  out.reserve(spans.size());
  for (uint64_t t : spans) out.push_back(static_cast<double>(t) * seconds_per_tick);
  return out;
}

}  // namespace rdmaxfer

#include "engine/timed_loop.h"

#include <chrono>
#include <deque>
#include <string>

#include "common/error.h"
#include "transport/transport.h"

namespace rdmaxfer {

namespace {
using Clock = std::chrono::steady_clock;

RequestPtr post(Connection& conn, const TimedLoopSpec& s) {
  TransferOptions options;
  if (s.op == OpKind::kWrite) {
    return conn.post_write(s.local, s.local_offset, s.remote, s.remote_offset, s.length, options);
  }
  return conn.post_read(s.local, s.local_offset, s.remote, s.remote_offset, s.length, options);
}

void finish(const RequestPtr& req, const TimedLoopSpec& s) {
  if (!req->wait_for(s.timeout_s, s.spin_us)) {
    throw Error(ErrorKind::kTimeout, std::string("timed_loop: ") + op_kind_name(s.op) + " of " +
                                         std::to_string(s.length) + " bytes did not complete within " +
                                         std::to_string(s.timeout_s) + " s");
  }
  req->rethrow();
}

// Posts `count` operations keeping up to `inflight` posted; calls on_done(now) as each oldest one
// completes (in posting order).
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
    on_done(Clock::now());
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
  if (spec.warmup > 0) run_phase(conn, spec, spec.warmup, [](Clock::time_point) {});

  std::vector<double> out;
  out.reserve(spec.iters);
  if (spec.inflight == 1) {
    for (uint64_t i = 0; i < spec.iters; ++i) {
      const Clock::time_point t0 = Clock::now();
      RequestPtr req = post(conn, spec);
      finish(req, spec);
      out.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return out;
  }
  Clock::time_point last = Clock::now();
  run_phase(conn, spec, spec.iters, [&](Clock::time_point now) {
    out.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
  });
  return out;
}

}  // namespace rdmaxfer

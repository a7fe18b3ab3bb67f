// A tight benchmark loop in C++ over any Connection (TCP or verbs), the way perftest times its
// operations: no interpreter between a completion and the next post.
//
// Stateless: timed_loop() runs to completion on the calling thread (the binding releases the
// GIL) and leaves nothing posted behind unless it throws (a failed or timed-out operation), in
// which case the operations still in flight finish or fail on the connection as usual.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/descriptor.h"
#include "core/region.h"
#include "core/request.h"

namespace rdmaxfer {

class Connection;

struct TimedLoopSpec {
  OpKind op = OpKind::kWrite;  // kWrite or kRead
  std::shared_ptr<MemoryRegion> local;
  uint64_t local_offset = 0;
  Descriptor remote;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
  uint64_t iters = 1;
  uint64_t warmup = 0;
  uint32_t inflight = 1;    // operations kept posted at once
  double timeout_s = 60.0;  // per operation
  // Each wait of a one-at-a-time loop spins (driving the transport's progress) this long
  // before it sleeps. With several in flight a wait spins at most pipeline_spin_us: the CPU is
  // better left to the device, which on soft-RoCE is the kernel on the same cores, and the
  // completion thread wakes the waiter.
  int spin_us = 1000;
  int pipeline_spin_us = 50;
};

// Runs `warmup` untimed operations, then `iters` timed ones, and returns `iters` durations in
// seconds. inflight == 1: each is post -> completion of one operation (latency). inflight > 1:
// up to `inflight` are posted at once and entry i is the time between the completions of
// operations i-1 and i (the first from the start of the timed phase), so the sum is the time
// from the first timed post to the last completion (bandwidth = length * iters / sum).
// Timestamps are TSC reads on x86 (like perftest), scaled by the TSC rate measured against
// steady_clock across the timed phase. Throws Error: bad arguments (kInvalidArgument), an operation failed (its error), a wait ran
// past timeout_s (kTimeout).
std::vector<double> timed_loop(Connection& conn, const TimedLoopSpec& spec);

}  // namespace rdmaxfer

#include "core/stats.h"

#include "common/error.h"
#include "common/log.h"
#include "core/request.h"

namespace rdmaxfer {

namespace {
constexpr const char* kKindNames[] = {"write", "read",    "send",   "recv",
                                      "ctrl",  "connect", "accept", "connection"};

// Index of `kind` in kKindNames among the first `count`; throws on any other name.
int kind_index(const std::string& kind, int count) {
  for (int i = 0; i < count; ++i) {
    if (kind == kKindNames[i]) return i;
  }
  throw Error(ErrorKind::kInvalidArgument, "stats: unknown counter kind '" + kind + "'");
}

void bump(std::atomic<uint64_t>& counter, uint64_t n) {
  counter.fetch_add(n, std::memory_order_relaxed);
}
}  // namespace

void Stats::add(const std::string& kind, int lane, uint64_t bytes) {
  add_op(kind, bytes);
  add_lane(lane, bytes);
}

void Stats::add_op(const std::string& kind, uint64_t bytes) {
  const auto i = static_cast<size_t>(kind_index(kind, kOpKinds));
  for (Stats* s = this; s != nullptr; s = s->parent_.get()) {
    bump(s->ops_[i], 1);
    bump(s->bytes_[i], bytes);
  }
}

void Stats::add_lane(int lane, uint64_t bytes) {
  if (lane < 0 || lane >= kMaxLanes) return;
  for (Stats* s = this; s != nullptr; s = s->parent_.get()) {
    Lane& l = s->lanes_[static_cast<size_t>(lane)];
    bump(l.bytes, bytes);
    bump(l.chunks, 1);
    int used = s->lanes_used_.load(std::memory_order_relaxed);
    while (used <= lane &&
           !s->lanes_used_.compare_exchange_weak(used, lane + 1, std::memory_order_relaxed)) {
    }
  }
}

void Stats::add_error(const std::string& kind) {
  const auto i = static_cast<size_t>(kind_index(kind, kErrorKinds));
  for (Stats* s = this; s != nullptr; s = s->parent_.get()) bump(s->errors_[i], 1);
}

void Stats::add_retry() {
  for (Stats* s = this; s != nullptr; s = s->parent_.get()) bump(s->retries_, 1);
}

void Stats::add_credit_stall() {
  for (Stats* s = this; s != nullptr; s = s->parent_.get()) bump(s->credit_stalls_, 1);
}

void Stats::add_linger_ns(uint64_t ns) {
  for (Stats* s = this; s != nullptr; s = s->parent_.get()) bump(s->linger_ns_, ns);
}

std::vector<std::pair<std::string, uint64_t>> Stats::snapshot() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  for (size_t i = 0; i < kOpKinds; ++i) {
    out.emplace_back(std::string(kKindNames[i]) + ".ops", get(ops_[i]));
    out.emplace_back(std::string(kKindNames[i]) + ".bytes", get(bytes_[i]));
  }
  for (size_t i = 0; i < kErrorKinds; ++i) {
    out.emplace_back(std::string("errors.") + kKindNames[i], get(errors_[i]));
  }
  out.emplace_back("retries", get(retries_));
  out.emplace_back("credit_stalls", get(credit_stalls_));
  if (parent_ == nullptr) out.emplace_back("io_linger_us", get(linger_ns_) / 1000);
  const int used = lanes_used_.load(std::memory_order_relaxed);
  for (int i = 0; i < used; ++i) {
    const Lane& l = lanes_[static_cast<size_t>(i)];
    out.emplace_back("lane" + std::to_string(i) + ".bytes", get(l.bytes));
    out.emplace_back("lane" + std::to_string(i) + ".chunks", get(l.chunks));
  }
  return out;
}

void count_terminal(Stats& stats, const Request& request, const char* kind) {
  if (request.state() == Request::State::kDone) {
    stats.add_op(kind, request.bytes());
    return;
  }
  const ErrorKind error_kind = request.error_kind();
  if (error_kind != ErrorKind::kClosed) stats.add_error(kind);
  const bool with_connection = error_kind == ErrorKind::kConnection ||
                               error_kind == ErrorKind::kTimeout ||
                               error_kind == ErrorKind::kClosed;
  const log::Level level = with_connection ? log::Level::kDebug : log::Level::kWarning;
  if (log::enabled(level)) log::write(level, request.error_message());
}

}  // namespace rdmaxfer

#include "common/log.h"

namespace rdmaxfer::log {

namespace {
std::atomic<Sink> g_sink{nullptr};
}  // namespace

void write(Level level, const std::string& message) {
  if (!enabled(level)) return;
  Sink sink = g_sink.load(std::memory_order_acquire);
  if (sink != nullptr) sink(level, message);
}

void set_sink(Sink sink, int threshold) {
  g_sink.store(sink, std::memory_order_release);
  set_threshold(sink != nullptr ? threshold : 100);
}

void set_threshold(int threshold) {
  detail::threshold.store(threshold, std::memory_order_relaxed);
}

}  // namespace rdmaxfer::log

#include "bindings/gil.h"

#include <atomic>
#include <chrono>
#include <thread>

namespace rdmaxfer {

namespace {
// Written before g_exiting is set, read after it is seen set (both sequentially consistent).
std::atomic<std::thread::id> g_exiter{};
std::atomic<bool> g_exiting{false};
}  // namespace

void begin_exit() {
  g_exiter.store(std::this_thread::get_id());
  g_exiting.store(true);
}

bool exiting_elsewhere() {
  return g_exiting.load() && g_exiter.load() != std::this_thread::get_id();
}

void park_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

GilRelease::GilRelease() : state_(PyEval_SaveThread()) {
  if (exiting_elsewhere()) park_forever();
}

GilRelease::~GilRelease() {
  if (exiting_elsewhere()) park_forever();
  PyEval_RestoreThread(state_);
}

}  // namespace rdmaxfer

#include "bindings/gil.h"

#include <atomic>
#include <chrono>
#include <thread>

namespace rdmaxfer {

namespace {
// Written before g_exiting is set, read after it is seen set (both sequentially consistent).
std::atomic<std::thread::id> g_exiter{};
std::atomic<bool> g_exiting{false};
// Threads between their look at g_exiting and holding the GIL: a thread counts itself in
// before it looks, begin_exit() sets g_exiting before it reads the count (all sequentially
// consistent), so either the thread sees g_exiting or begin_exit() waits for it.
std::atomic<int> g_acquiring{0};
// How long begin_exit() lets such threads take the GIL and park.
constexpr auto kAcquiringWait = std::chrono::seconds(2);
}  // namespace

void begin_exit() {
  g_exiter.store(std::this_thread::get_id());
  g_exiting.store(true);
  // A thread that looked before g_exiting was set may be waiting for the GIL this thread
  // holds: let it take the GIL, see g_exiting and park before the exit goes on.
  PyThreadState* state = PyEval_SaveThread();
  const auto until = std::chrono::steady_clock::now() + kAcquiringWait;
  while (g_acquiring.load() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  PyEval_RestoreThread(state);
}

bool exiting_elsewhere() {
  return g_exiting.load() && g_exiter.load() != std::this_thread::get_id();
}

void park_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void take_gil_or_park(PyThreadState* state) {
  g_acquiring.fetch_add(1);
  if (exiting_elsewhere()) {
    g_acquiring.fetch_sub(1);
    park_forever();
  }
  PyEval_RestoreThread(state);
  g_acquiring.fetch_sub(1);
  // begin_exit() ran while this thread waited for the GIL: give it back and park.
  if (exiting_elsewhere()) {
    PyEval_SaveThread();
    park_forever();
  }
}

GilRelease::GilRelease() : state_(PyEval_SaveThread()) {
  if (exiting_elsewhere()) park_forever();
}

GilRelease::~GilRelease() { take_gil_or_park(state_); }

}  // namespace rdmaxfer

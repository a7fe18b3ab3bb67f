#include "common/fork_guard.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace rdmaxfer {

namespace {

// Never freed: the child keeps what it inherited until it exits.
struct State {
  std::mutex mu;
  std::vector<std::weak_ptr<void>> live;
  size_t prune_at = 64;
  std::unordered_set<const void*> inherited;
  std::vector<std::shared_ptr<void>> kept;
  pid_t parent_pid = 0;
};
State& state() {
  static State* s = new State;
  return *s;
}
std::atomic<uint64_t> g_generation{0};

// The registry's mutex is held across fork(), so the child never finds it locked by a thread
// that does not exist there.
void prepare() {
  state().mu.lock();
  state().parent_pid = getpid();
}
void parent() { state().mu.unlock(); }
void child() {
  State& s = state();
  for (const auto& w : s.live) {
    if (auto obj = w.lock()) {
      s.inherited.insert(obj.get());
      s.kept.push_back(std::move(obj));
    }
  }
  s.live.clear();
  g_generation.fetch_add(1);
  s.mu.unlock();
}

void install() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(prepare, parent, child); });
}

}  // namespace

void keep_in_child(const std::shared_ptr<void>& obj) {
  install();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.live.size() >= s.prune_at) {
    std::vector<std::weak_ptr<void>> alive;
    for (auto& w : s.live) {
      if (!w.expired()) alive.push_back(std::move(w));
    }
    s.live = std::move(alive);
    s.prune_at = std::max<size_t>(64, 2 * s.live.size());
  }
  s.live.push_back(obj);
}

bool inherited(const void* obj) {
  if (g_generation.load() == 0) return false;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.inherited.count(obj) != 0;
}

uint64_t fork_generation() {
  install();
  return g_generation.load();
}

std::string inherited_text(const char* what) {
  return std::string(what) + " was created by process " + std::to_string(state().parent_pid) +
         " before fork(): rdmaxfer objects inherited through fork() are inert in the child "
         "(its connections, registrations and threads belong to the parent); create a new "
         "Engine in this process";
}

}  // namespace rdmaxfer

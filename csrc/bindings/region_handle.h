// What Python holds for a registered region (``_core.Region``): the region, its engine (kept
// alive by keep_alive on the Python side) and whether it is still registered.
#pragma once

#include <memory>

#include "common/error.h"
#include "common/fork_guard.h"
#include "core/region.h"
#include "engine/engine.h"

namespace rdmaxfer {

struct RegionHandle {
  std::shared_ptr<MemoryRegion> region;
  Engine* engine;
  bool registered = true;
};

// The region of `h` for an operation; throws Error(kClosed) in a child of fork() and
// Error(kInvalidArgument) once deregistered.
inline std::shared_ptr<MemoryRegion> live_region(const RegionHandle& h) {
  if (inherited(h.region.get())) throw Error(ErrorKind::kClosed, inherited_text("this region"));
  if (!h.registered) {
    throw Error(ErrorKind::kInvalidArgument,
                "the local region was deregistered; register the buffer again");
  }
  return h.region;
}

}  // namespace rdmaxfer

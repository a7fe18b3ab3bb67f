// How many CPUs this process may run on.
#pragma once

namespace rdmaxfer {

// The CPUs of this process's affinity mask (sched_getaffinity), at least 1; the machine's count
// where the mask cannot be read.
int usable_cpus();

}  // namespace rdmaxfer

// Releasing the GIL around the core's blocking calls, and what such a call does when the
// interpreter exits meanwhile.
//
// At exit the package's atexit hook (rdmaxfer/transport/lifecycle.py) calls begin_exit() and
// then closes every engine, which fails the waits of threads blocked in the core. Python then
// finalizes while daemon threads may still be on their way back from such calls; a thread that
// takes the GIL back during finalization is ended by pthread_exit, whose forced unwind through
// the bindings' frames ends in std::terminate (exit 134) or worse. So once begin_exit() ran,
// any thread but the one that called it (the exiting thread) never takes the GIL back: it
// parks, sleeping until the process ends, as CPython 3.14 does with such threads itself.
#pragma once

#include <Python.h>

namespace rdmaxfer {

// Marks the interpreter as exiting, from the thread that exits it (the atexit hook's).
void begin_exit();

// True once begin_exit() ran on another thread than this one: this thread must not run
// Python code again (see park_forever).
bool exiting_elsewhere();

// Sleeps until the process ends; for a thread that may no longer take the GIL. The thread
// holds no lock of the core here (every GilRelease scope ends with the core's locks released).
[[noreturn]] void park_forever();

// Takes the GIL back for ``state`` (this thread's, saved by PyEval_SaveThread), or parks when
// the interpreter began exiting on another thread, also when that happened while this thread
// waited for the GIL (begin_exit() waits for such threads to see it).
void take_gil_or_park(PyThreadState* state);

// Releases the GIL for the scope (like pybind11's gil_scoped_release), parking instead of
// taking it back when the interpreter began exiting on another thread (also at construction:
// such a thread starts no new core call).
class GilRelease {
 public:
  GilRelease();
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace rdmaxfer

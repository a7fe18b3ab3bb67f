// Fork safety: objects created before fork() belong to the parent.
//
// Their QPs, MRs, CQs and sockets are shared with the parent through inherited file descriptors
// and mappings, and their threads do not exist in the child. So in a child they must never act
// (no GOODBYE, no shutdown(2), no QP change, no ibv_dereg_mr, no CQ poll) and never be destroyed
// (destructors would join threads that are not there and free the parent's verbs objects).
//
// keep_in_child(obj) registers an object handed to the application. At fork, in the child
// (pthread_atfork), every registered object still alive is kept alive for good and inherited()
// is true for it; fork_generation() counts the forks this process descends from. Callers make
// inherited objects inert: their operations raise Error(kClosed, inherited_text()), close() does
// nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace rdmaxfer {

void keep_in_child(const std::shared_ptr<void>& obj);
bool inherited(const void* obj);
uint64_t fork_generation();
// "... was created by process P before fork(): create a new Engine in this process".
std::string inherited_text(const char* what);

}  // namespace rdmaxfer

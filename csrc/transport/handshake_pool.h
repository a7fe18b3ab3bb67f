// The acceptor side's handshakes, each on its own thread, so a stalled client delays nobody.
//
// Lifecycle: constructed (nothing runs) -> start(fd, work) once per accepted socket: `work(fd)`
// runs on a new thread (at most `max_in_flight` at once; full() says when the acceptor should
// leave further clients in the listen backlog) -> stop(): every socket still in a handshake is
// shut down (shutdown(SHUT_RDWR) on a duplicate the pool keeps, so the worker's blocked read or
// write fails at once whatever it did with its own fd), then every worker is joined. Workers
// bound their own waits (the handshake timeout); stop() bounds close() by what a worker does
// after its socket failed. The destructor calls stop().
//
// `work` owns the fd and handles its own errors; an exception that escapes it is dropped (the
// socket is closed) so one client never takes the acceptor down.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <mutex>
#include <thread>

#include "common/unique_fd.h"

namespace rdmaxfer {

class HandshakePool {
 public:
  explicit HandshakePool(int max_in_flight);
  ~HandshakePool();
  HandshakePool(const HandshakePool&) = delete;
  HandshakePool& operator=(const HandshakePool&) = delete;

  // Runs work(fd) on a new thread; after stop() the fd is closed and nothing runs. Throws
  // Error(kTransport) with errno text when the fd cannot be duplicated or no thread starts.
  void start(UniqueFd fd, std::function<void(UniqueFd)> work);
  // True while max_in_flight handshakes run.
  bool full();
  // Shuts down the socket of every handshake running for longer than `seconds` (its worker
  // then fails at once and frees its slot); returns how many it cut.
  int cut_older_than(double seconds);
  int in_flight();
  void stop();

 private:
  struct Worker {
    UniqueFd cancel;  // a duplicate of the worker's socket, shut down by stop()
    std::thread thread;
    std::chrono::steady_clock::time_point started;
    bool done = false;
  };
  void reap_locked();

  const int max_in_flight_;
  std::mutex mu_;
  std::list<Worker> workers_;
  std::list<Worker> finished_;  // joined outside mu_
  bool stopped_ = false;
};

}  // namespace rdmaxfer

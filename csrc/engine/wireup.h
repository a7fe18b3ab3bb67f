// Wireup: which transport carries each connection of an engine (like UCX's wireup, per peer).
//
// An engine made with transport="auto" holds its network transport (verbs when a device is
// active, else TCP) and, when shm can run here, a same-host companion (transport/registry.h:
// make_same_host_companion) that serves the network transport's registrations. Both listen on
// one port number: the network listener on host:port, the shm listener on the abstract UNIX
// socket of that port (transport/shm/shm_transport.h).
//
// connect(host, port): when host is an address of this machine, shm is tried first; its
// handshake learns whether both ends share a kernel (boot id), a network and PID namespace and
// a user, and whether CMA works between them (Yama's ptrace_scope, seccomp). When it does not
// reach the peer, the network transport connects and the link says why shm was passed over
// (logged at INFO for a same-host peer). accept() hands out whichever arrives first.
//
// With a forced transport ("tcp", "rdma", "shm") there is no companion and every connection
// goes over that transport.
//
// The shm listener is found by port number alone (its abstract socket is per network
// namespace, not per address): two engines of one host listening on one port number at two
// different addresses share one abstract name, and the second gets no shm listener (logged; its
// same-host peers connect over the network transport).
//
// Lifecycle: made by the engine with its transports -> listen (optional) -> accept/connect;
// the engine shuts the transports down (the Wireup holds no thread and no handle).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "transport/transport.h"

namespace rdmaxfer {

// One connection and the transport chosen for it.
struct Link {
  std::shared_ptr<Channel> channel;
  std::string transport;  // "tcp", "rdma", "shm"
  std::string note;       // why shm was not chosen ("" when it was, or was never in question)
};

class Wireup {
 public:
  // `network`: the engine's transport; `shm`: its same-host companion, or null with
  // `shm_off` saying why there is none ("" for a forced transport). Both outlive the Wireup.
  Wireup(Transport& network, Transport* shm, std::string shm_off);

  uint16_t listen(const std::string& host, uint16_t port);
  Link accept(double timeout_s);
  Link connect(const std::string& host, uint16_t port, const ConnectOptions& options);

  // "" when same-host peers get shm or the engine's transport was forced, else why not (the
  // reason shm cannot run here, or why the shm listener could not be opened).
  std::string shm_off() const;

 private:
  Link network_link(std::shared_ptr<Channel> channel, std::string note) const;

  Transport& network_;
  Transport* shm_;
  mutable std::mutex mu_;
  std::string shm_off_;
  bool shm_listening_ = false;
  uint16_t port_ = 0;  // the port both listen on (accept's message)
};

}  // namespace rdmaxfer

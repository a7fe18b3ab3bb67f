// The tcp transport's one line in the registry (transport/registry.h).
#include "transport/registry.h"
#include "transport/tcp/tcp_transport.h"

namespace rdmaxfer {

namespace {
TcpConfig tcp_config(const TransportConfig& c) {
  TcpConfig t;
  t.io_threads = c.io_threads;
  t.socket_buffer = c.socket_buffer;
  t.default_streams = c.default_streams;
  t.secret = c.secret;
  t.poll_mode = c.poll_mode;
  t.tls = c.tls("tcp", &t.tls_settings);
  return t;
}

const TransportRegistration kTcpRegistration{TransportEntry{
    TcpTransport::declared(), nullptr,
    [](uint64_t engine_id, const TransportConfig& c) {
      return std::make_unique<TcpTransport>(engine_id, tcp_config(c));
    },
    nullptr, nullptr}};
}  // namespace

}  // namespace rdmaxfer

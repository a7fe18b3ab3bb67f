# The sources of the tcp transport (sockets, framed streams), for CMakeLists.txt's
# RDMAXFER_TRANSPORTS; tcp_registration.cc registers it.
list(APPEND RDMAXFER_TRANSPORT_SOURCES
  csrc/transport/tcp/io_loop.cc
  csrc/transport/tcp/tcp_stream.cc
  csrc/transport/tcp/tcp_connection.cc
  csrc/transport/tcp/tcp_gather.cc
  csrc/transport/tcp/tcp_transport.cc
  csrc/transport/tcp/tcp_registration.cc
)

# The sources of the loopback transport (in process, for tests), for CMakeLists.txt's
# RDMAXFER_TRANSPORTS; loopback_registration.cc registers it.
list(APPEND RDMAXFER_TRANSPORT_SOURCES
  csrc/transport/loopback/loopback_channel.cc
  csrc/transport/loopback/loopback_transport.cc
  csrc/transport/loopback/loopback_registration.cc
)

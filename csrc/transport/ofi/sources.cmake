# The sources of the ofi transport (libfabric, loaded at run time), for CMakeLists.txt's
# RDMAXFER_TRANSPORTS; ofi_registration.cc registers it. It compiles against libfabric's API
# headers vendored in third_party/libfabric (ahead of the system's), so a build machine without
# libfabric-dev builds the same thing.
include_directories(BEFORE SYSTEM third_party/libfabric/include)
list(APPEND RDMAXFER_TRANSPORT_SOURCES
  csrc/transport/ofi/ofi_api.cc
  csrc/transport/ofi/ofi_settings.cc
  csrc/transport/ofi/ofi_wire.cc
  csrc/transport/ofi/ofi_domain.cc
  csrc/transport/ofi/ofi_channel.cc
  csrc/transport/ofi/ofi_rails.cc
  csrc/transport/ofi/ofi_heal.cc
  csrc/transport/ofi/ofi_transport.cc
  csrc/transport/ofi/ofi_registration.cc
)
# The bindings' _ofi functions (bindings/ofi_bindings.cc) see the same headers.
target_include_directories(_core SYSTEM BEFORE PRIVATE third_party/libfabric/include)

# The sources of the shm transport (same host: rings, CMA, CUDA IPC), for CMakeLists.txt's
# RDMAXFER_TRANSPORTS; shm_registration.cc registers it.
list(APPEND RDMAXFER_TRANSPORT_SOURCES
  csrc/transport/shm/same_host.cc
  csrc/transport/shm/shm_ring.cc
  csrc/transport/shm/cma_copy.cc
  csrc/transport/shm/shm_setup.cc
  csrc/transport/shm/cuda_ipc.cc
  csrc/transport/shm/shm_channel.cc
  csrc/transport/shm/shm_gather.cc
  csrc/transport/shm/shm_fd_passing.cc
  csrc/transport/shm/shm_transport.cc
  csrc/transport/shm/shm_registration.cc
)

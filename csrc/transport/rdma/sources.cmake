# The sources of the verbs transport (libibverbs, loaded at run time), for CMakeLists.txt's
# RDMAXFER_TRANSPORTS; rdma_registration.cc registers it.
list(APPEND RDMAXFER_TRANSPORT_SOURCES
  csrc/transport/rdma/verbs_api.cc
  csrc/transport/rdma/verbs_context.cc
  csrc/transport/rdma/verbs_pd.cc
  csrc/transport/rdma/verbs_mr.cc
  csrc/transport/rdma/verbs_cq.cc
  csrc/transport/rdma/verbs_qp.cc
  csrc/transport/rdma/verbs_srq.cc
  csrc/transport/rdma/buffer_slab.cc
  csrc/transport/rdma/endpoint_record.cc
  csrc/transport/rdma/control_msg.cc
  csrc/transport/rdma/send_queue.cc
  csrc/transport/rdma/cq_poller.cc
  csrc/transport/rdma/cq_set.cc
  csrc/transport/rdma/fabric_settings.cc
  csrc/transport/rdma/rdma_connection.cc
  csrc/transport/rdma/rdma_completions.cc
  csrc/transport/rdma/rdma_messages.cc
  csrc/transport/rdma/rdma_gather.cc
  csrc/transport/rdma/rdma_removal.cc
  csrc/transport/rdma/rdma_healing.cc
  csrc/transport/rdma/rdma_striping.cc
  csrc/transport/rdma/rdma_rails.cc
  csrc/transport/rdma/rdma_transport.cc
  csrc/transport/rdma/rdma_events.cc
  csrc/transport/rdma/rdma_registration.cc
)

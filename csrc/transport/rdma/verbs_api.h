// libibverbs, loaded at run time.
//
// libibverbs.so.1 is opened once with dlopen and its entry points are looked up by versioned
// symbol (IBVERBS_1.1, the ABI every rdma-core since 2016 exports; IBVERBS_1.8 / 1.12 for the
// optional newer calls) into one table of function pointers, like NCCL's ibvsymbols. Nothing in
// rdmaxfer links against libibverbs, so importing the module never fails on a machine without
// it: the rdma transport reports why it is unavailable instead.
//
// ibv_reg_mr and ibv_query_port are macros/inline wrappers in verbs.h that name exported
// symbols, so they get their own shims here (reg_mr, query_port). The data-path calls
// (ibv_post_send/recv, ibv_poll_cq, ibv_req_notify_cq) are inline functions that go through the
// context's ops table and need no symbol. Every other verbs call in csrc/transport/rdma goes
// through this table; a stray direct call would show up as an undefined ibv_* symbol in _core.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "common/error.h"

namespace rdmaxfer {

struct VerbsApi {
  // IBVERBS_1.1 (required)
  ibv_device** (*get_device_list)(int*) = nullptr;
  void (*free_device_list)(ibv_device**) = nullptr;
  const char* (*get_device_name)(ibv_device*) = nullptr;
  ibv_context* (*open_device)(ibv_device*) = nullptr;
  int (*close_device)(ibv_context*) = nullptr;
  int (*query_device)(ibv_context*, ibv_device_attr*) = nullptr;
  int (*query_port_compat)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context*) = nullptr;
  int (*dealloc_pd)(ibv_pd*) = nullptr;
  ibv_mr* (*reg_mr_v11)(ibv_pd*, void*, size_t, int) = nullptr;
  int (*dereg_mr)(ibv_mr*) = nullptr;
  ibv_comp_channel* (*create_comp_channel)(ibv_context*) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel*) = nullptr;
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroy_cq)(ibv_cq*) = nullptr;
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**) = nullptr;
  void (*ack_cq_events)(ibv_cq*, unsigned int) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  int (*query_qp)(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*) = nullptr;
  int (*destroy_qp)(ibv_qp*) = nullptr;
  ibv_srq* (*create_srq)(ibv_pd*, ibv_srq_init_attr*) = nullptr;
  int (*modify_srq)(ibv_srq*, ibv_srq_attr*, int) = nullptr;
  int (*destroy_srq)(ibv_srq*) = nullptr;
  int (*get_async_event)(ibv_context*, ibv_async_event*) = nullptr;
  void (*ack_async_event)(ibv_async_event*) = nullptr;
  const char* (*wc_status_str)(ibv_wc_status) = nullptr;
  const char* (*event_type_str)(ibv_event_type) = nullptr;
  // Optional (nullptr when this libibverbs is older)
  ibv_mr* (*reg_mr_iova2)(ibv_pd*, void*, size_t, uint64_t, unsigned int) = nullptr;  // 1.8
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int) = nullptr;  // 1.12

  // The shims for verbs.h's macros.
  ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, unsigned int access) const;
  int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr) const;
};

// The loaded table, or nullptr with `why` set ("libibverbs.so.1 not found: ..."). Loads once;
// later calls return the same answer. Thread-safe.
const VerbsApi* verbs_api(std::string* why);
// The table; throws Error(kUnsupported) with the reason when libibverbs cannot be loaded.
const VerbsApi& verbs();

// "ibv_xxx: strerror (errno N)" as an Error of `kind` (errno taken from `err`).
[[noreturn]] void throw_verbs(const std::string& op, int err);

// "remote access error (IBV_WC_REM_ACCESS_ERR, wc_status 10)".
std::string wc_status_text(ibv_wc_status status);
// "IBV_WC_REM_ACCESS_ERR", ...
std::string wc_status_name(ibv_wc_status status);
// A failed completion's status, for Error (common/error.h).
CompletionStatus completion_status(const ibv_wc& wc);

}  // namespace rdmaxfer

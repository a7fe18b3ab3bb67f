"""What ``Endpoint.info`` and ``Endpoint.describe()`` say about a connection.

``info`` is a dict of str -> int or str: what the connection is and what was negotiated with
the peer. Keys:

``transport``, ``peer``, ``streams``
    On every connection: ``"tcp"``/``"rdma"``/``"shm"`` (the one this connection uses), the
    peer's ``host:port``, the parallel streams (TCP connections or QPs).
``shm_not_used``
    When an automatic engine passed shm over: why (another host, user or namespace, CMA
    refused).
``auto``
    On an automatic engine: why this connection's transport (shm: the peer is on this host;
    else the network transport ``transport="auto"`` took, after the refusals of those ranked
    above it, e.g. ``"ofi: rdma not usable (no RDMA device with an active port and RC queue
    pairs ...)"``).
``provider``, ``fabric``, ``domain``, ``max_message``, ``notify_chunk``, ``inject_size``,
``cq_data_size``, ``hmem``
    On ofi: the libfabric provider that carries the connection (``"verbs;ofi_rxm"``,
    ``"tcp;ofi_rxm"``, ``"efa"``), its fabric and domain (a NIC, or an interface for tcp), as
    ``fi_getinfo`` named them; the largest RMA a request is cut into (bytes), the chunk size
    of notified writes (bytes), the provider's inject size (bytes) and bytes of remote CQ data;
    ``hmem`` 1 when the provider registers GPU memory with the NIC (FI_HMEM, asked for when
    CUDA loads and ``RDMAXFER_OFI_HMEM`` is not 0), 0 when GPU memory is staged through host
    memory.
``peer_pid``, ``ring_bytes``, ``cuda_ipc_bytes``, ``cuda_ipc_opened``, ``cuda_ipc_closed_stale``
    On shm: the peer's pid, the bytes of each ring; the bytes moved GPU to GPU by CUDA IPC
    (GPU memory at either end, registered or exported on the fly), the peer's GPU allocations
    this end has open, and the mappings of them it closed (the peer named another allocation
    at the same address, or beyond the 128 kept by IPC handle).
``cuda_ipc_off``
    On shm, once the engine has used GPU memory, when registered GPU memory is staged through
    host memory instead of moved by CUDA IPC: why (the driver lacks the IPC calls; an
    automatic engine over rdma registers GPU memory for GPUDirect RDMA).
``cuda_ipc_export_off``
    On shm, when unregistered GPU memory was staged instead of exported for CUDA IPC on the
    fly (and ``cuda_ipc_off`` is absent): why (the driver does not report
    CU_POINTER_ATTRIBUTE_BUFFER_ID, the memory cannot be exported, or
    ``RDMAXFER_CUDA_IPC_EXPORTS=0``). TCP and rdma connections stage unregistered GPU memory.
``path_mtu``, ``max_rd_atomic``, ``max_dest_rd_atomic``, ``max_inline``, ``rnr_retry``, ...
    On rdma: the smaller active MTU of the two ports (bytes); the RDMA READs this side keeps
    outstanding (the minimum of its initiator depth and the peer's responder resources) and
    serves at once (its responder resources against the peer's initiator depth, both from the
    endpoint records); ``max_inline``, the bytes a WR carries inline; ``rnr_retry``, the RNR
    retry count; ``outstanding_wrs``, the WRs posted and not completed; ``posted_receives``,
    the receive WRs its QPs posted themselves (0 on a rail with a shared receive queue);
    ``ctrl_repeats``, the peer's control SENDs that arrived a second time and were dropped (a
    SEND whose ACK was lost with a failed rail is sent again; ``control_msg.h``: seq).
``srq``, ``srq_posted``, ``srq_buffers``, ``srq_grows``
    On rdma: 1 when the connection's QPs take their receives from their rails' shared receive
    queues (0: each QP posts its own, the device has no SRQ or ``RDMAXFER_SRQ=0``); the
    receive buffers posted on those SRQs and allocated for them (16 KiB each), shared by every
    connection on the same rails, so they do not grow with the number of peers; and the times
    those SRQs added a step of buffers (``RDMAXFER_SRQ_BUFFERS``, default 256) because fewer
    than a quarter were posted.
``rails``, ``rail_<device>_bytes``, ``rail_<device>_up``, ``rail_<device>_removed``,
``rail_<device>_rate``, ``rail_<device>_share_pct``, ``rail_<device>_rejoins``
    On rdma: the rails the connection has QPs on and, per rail, the bytes it carried, 1 while
    it is up (0 once it failed), 1 once its device was removed, the rate it delivers now in
    bytes/s (measured from this connection's completions while the rail is busy, decayed over
    its last ~0.5 s of busy time; 0 until measured) and its share of the last striped
    transfer in percent (``csrc/transport/rdma/rail_meter.h``), and how many times it
    rejoined after failing (``csrc/transport/rdma/rdma_healing.cc``).
``service_level``, ``traffic_class``, ``min_rnr_timer``, ``applied_`` + each, ``roce``
    On rdma, the fabric settings (``csrc/transport/rdma/fabric_settings.h``; every rail's QPs
    get the same): as the first QP holds them, read back with ``ibv_query_qp``, and as they
    were given to ``ibv_modify_qp`` (the traffic class is 0 where no GRH is sent,
    InfiniBand); ``roce`` is 1 when that QP's rail is Ethernet, where the traffic class (the
    IP TOS byte) is what the packets carry (rxe reads back no service level).
"""

from __future__ import annotations

from .. import _core, _transports


def connection_info(core: _core.Endpoint, engine: _core.Engine) -> dict[str, int | str]:
    """The ``info`` dict of the connection ``core`` of ``engine`` (keys above)."""
    info: dict[str, int | str] = {
        "transport": core.transport,
        "peer": core.peer,
        "streams": core.streams,
    }
    if core.transport_note:
        info["shm_not_used"] = core.transport_note.removeprefix("shm not used: ")
    if engine.automatic:
        same_host = not _transports.capabilities(core.transport).network
        info["auto"] = (
            f"{core.transport}: the peer is on this host" if same_host else engine.auto_why
        )
    info.update(core.attributes())
    return info


def connection_text(core: _core.Endpoint) -> str:
    """One line naming the transport, the peer, the streams and the negotiated settings, with
    why shm was not used when it was not."""
    text, kind, note = core.describe(), core.transport, core.transport_note
    text = text if text.startswith(kind) else f"{kind} {text}"
    return f"{text} ({note})" if note else text

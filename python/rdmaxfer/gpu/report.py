"""What ``rdmaxfer info`` prints about GPUs: the driver, each GPU with its PCIe address and
nearest RDMA NICs, per usable transport the GPUDirect decision of
:func:`rdmaxfer.gpu.gpudirect.preflight`, and CUDA IPC between processes of this host
(:func:`cuda_ipc_report`); ``rdmaxfer doctor`` reports both decisions too."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .. import _core, _transports
from ..memory import cuda
from . import gpudirect, topology

__all__ = ["cuda_ipc_report", "gpu_report"]


def gpu_report(
    transports: Mapping[str, str],
    sysfs_root: str | os.PathLike[str] = "/sys",
    rdma_device: str | None = None,
    *,
    procfs_root: str | os.PathLike[str] = "/proc",
    cuda_status: dict[str, Any] | None = None,
    verbs_dmabuf: str | None = None,
) -> dict[str, Any]:
    """The GPU part of ``rdmaxfer info``.

    Args:
        transports: ``_core.available_transports()`` (name -> "" when usable).
        sysfs_root, procfs_root: sysfs and procfs (tests pass fake trees).
        rdma_device: the RDMA device the transport on named devices (rails) uses, when known.
        cuda_status: the CUDA driver's facts (default: :func:`rdmaxfer.memory.cuda.status`).
        verbs_dmabuf: why libibverbs has no ``ibv_reg_dmabuf_mr`` ("" when it has; default:
            ``_core.verbs_dmabuf_unavailable()``).

    Returns:
        ``{"cuda": "available" or why not, "driver_version": "12.4" or None, "gpus": [{...,
        "nics": [{"name", "pci_bus_id", "link"}]}], "gpudirect": {transport: {"method",
        "reasons"}}, "cuda_ipc": cuda_ipc_report(...)}``.
    """
    s = cuda.status() if cuda_status is None else cuda_status
    if verbs_dmabuf is None:
        verbs_dmabuf = _core.verbs_dmabuf_unavailable()
    gpus = []
    for g in s["gpus"]:
        nics = topology.nearest_nics(g["pci_bus_id"], sysfs_root) if g["pci_bus_id"] else []
        gpus.append(
            {
                **g,
                "nics": [
                    {"name": n.name, "pci_bus_id": n.pci_bus_id, "link": n.link} for n in nics
                ],
            }
        )
    checks = {}
    for name, reason in transports.items():
        if reason:
            continue
        check = gpudirect.preflight(
            name,
            rdma_device=rdma_device if _transports.capabilities(name).rails else None,
            cuda_status=s,
            sysfs_root=sysfs_root,
            procfs_root=procfs_root,
            verbs_dmabuf=verbs_dmabuf,
        )
        checks[name] = check.as_dict()
    return {
        "cuda": s["unavailable"] or "available",
        "driver_version": (
            cuda.driver_version_text(s["driver_version"]) if s["driver_version"] else None
        ),
        "gpus": gpus,
        "gpudirect": checks,
        "cuda_ipc": cuda_ipc_report(s),
    }


def cuda_ipc_report(cuda_status: dict[str, Any] | None = None) -> dict[str, Any]:
    """CUDA IPC between processes of this host (the shm transport's GPU path,
    ``csrc/transport/shm/cuda_ipc.h``): whether the driver offers the IPC calls, and for each
    ordered pair of GPUs whether the first can access the second's memory directly
    (``cuDeviceCanAccessPeer``: copies between them then go peer to peer, else the driver
    stages them through host memory). The one decision ``rdmaxfer info``, ``rdmaxfer doctor``
    and ``Endpoint.info["cuda_ipc_off"]`` report, read from the driver by
    ``_core.cuda_status()``.

    Args:
        cuda_status: the CUDA driver's facts (default: :func:`rdmaxfer.memory.cuda.status`).

    Returns:
        ``{"calls": "available" or why not, "pairs": [{"gpu": i, "peer": j, "peer_access":
        True, False or None (the driver cannot say)}]}``, no pairs without CUDA or with one GPU.
    """
    s = cuda.status() if cuda_status is None else cuda_status
    if s["unavailable"]:
        return {"calls": s["unavailable"], "pairs": []}
    known = bool(s.get("can_access_peer"))
    pairs = [
        {
            "gpu": int(g["index"]),
            "peer": int(p["index"]),
            "peer_access": int(p["index"]) in g.get("peer_access", []) if known else None,
        }
        for g in s["gpus"]
        for p in s["gpus"]
        if p["index"] != g["index"]
    ]
    return {"calls": s.get("cuda_ipc") or "available", "pairs": pairs}

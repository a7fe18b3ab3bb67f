"""The GPUDirect decision, made once: how GPU memory is registered for RDMA.

:func:`preflight` picks, in order of preference, ``dmabuf`` (Linux >= 5.12, ``ibv_reg_dmabuf_mr``
in libibverbs, the driver's ``cuMemGetHandleForAddressRange``, the open NVIDIA kernel modules
and the GPU's ``CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED``), ``peermem`` (the nvidia-peermem
kernel module), else ``staging`` (through pinned host buffers), and says why not the others.
``Engine.gpu_preflight``, ``rdmaxfer info`` (:mod:`rdmaxfer.gpu.report`) and ``rdmaxfer
doctor`` all ask it, so they cannot disagree.

It reads facts only from its arguments and from files under a sysfs and a procfs root
(``/sys``, ``/proc`` by default; tests pass fake trees).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _transports
from .topology import is_software_rdma

__all__ = ["METHODS", "GpuDirectPreflight", "kernel_version", "open_kernel_modules", "preflight"]

#: The registrations, in order of preference.
METHODS = ("dmabuf", "peermem", "staging")


def kernel_version(
    release: str | None = None, procfs_root: str | os.PathLike[str] = "/proc"
) -> tuple[int, int]:
    """``"5.15.0-91-generic"`` -> ``(5, 15)``; (0, 0) when unparseable. Default: the kernel
    that ``<procfs_root>/sys/kernel/osrelease`` names (``uname -r`` when unreadable)."""
    if release is None:
        try:
            release = (Path(procfs_root) / "sys" / "kernel" / "osrelease").read_text()
        except OSError:
            release = os.uname().release
    text = release.strip()
    m = re.match(r"^(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@dataclass
class GpuDirectPreflight:
    """Which GPU memory registration to use, and why not the others.

    ``method`` is ``"dmabuf"``, ``"peermem"`` or ``"staging"``; ``reasons[m]`` is "" when
    method ``m`` is usable, else why not (staging is always usable).
    """

    method: str
    reasons: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """One line per method: ``"dmabuf: unavailable: <why>"``."""
        lines = []
        for m in METHODS:
            why = self.reasons.get(m, "")
            mark = "<- used" if m == self.method else ""
            lines.append(
                f"{m}: {'available' if not why else 'unavailable: ' + why} {mark}".rstrip()
            )
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "reasons": dict(self.reasons)}


def preflight(
    transport: str,
    *,
    gpu_direct: bool | None = None,
    gpu_direct_off: str = "",
    rdma_device: str | None = None,
    cuda_status: dict[str, Any] | None = None,
    gpu: int = 0,
    sysfs_root: str | os.PathLike[str] = "/sys",
    procfs_root: str | os.PathLike[str] = "/proc",
    kernel_release: str | None = None,
    verbs_dmabuf: str = "",
) -> GpuDirectPreflight:
    """Decide how GPU memory of GPU ``gpu`` is registered on ``transport``.

    Args:
        transport: the engine's transport (``"tcp"``, ``"rdma"``...): GPUDirect RDMA needs
            one that declares ``gpu_direct`` (:mod:`rdmaxfer._transports`).
        gpu_direct: whether the engine's transport registers GPU memory with its NIC (its
            ``capabilities()``: on ``"ofi"``, when the libfabric provider granted FI_HMEM);
            None: what ``transport`` declares.
        gpu_direct_off: why the engine's transport does not, in its own words
            (``Engine.gpu_direct_off``: a provider without FI_HMEM); "": it moves bytes with
            the CPU.
        rdma_device: the RDMA device in use (``"mlx5_0"``, ``"rxe0"``); None: unknown.
        cuda_status: ``_core.cuda_status()`` (driver version, GPUs and their dmabuf support).
        gpu: the GPU's ordinal.
        sysfs_root: where sysfs is (tests pass a fake tree).
        procfs_root: where procfs is: the kernel release, the NVIDIA driver's version line.
        kernel_release: ``uname -r`` (default: read under ``procfs_root``); dmabuf MRs need
            Linux >= 5.12.
        verbs_dmabuf: "" when libibverbs has ``ibv_reg_dmabuf_mr``, else why not.

    Returns:
        The method to use and, per method, why it is not usable ("" when it is).
    """
    reasons: dict[str, str] = {"staging": ""}
    status = cuda_status or {}
    common = ""
    if not (_transports.capabilities(transport).gpu_direct if gpu_direct is None else gpu_direct):
        nic = [n for n in _transports.listed() if _transports.capabilities(n).gpu_direct]
        use = " or ".join(map(repr, nic)) or "an RDMA transport"
        common = (
            f"{gpu_direct_off}, so GPU memory is staged through host memory; GPUDirect RDMA "
            f"needs a provider with FI_HMEM or transport={use}"
            if gpu_direct_off
            else f"the {transport} transport moves bytes with the CPU; GPUDirect RDMA needs an "
            f"RDMA NIC (use transport={use})"
        )
    elif status.get("unavailable"):
        common = str(status["unavailable"])
    elif rdma_device and is_software_rdma(rdma_device, sysfs_root):
        common = (
            f"{rdma_device} is a software RDMA device (rxe/siw): the CPU moves its bytes, so it "
            "cannot DMA GPU memory"
        )
    gpus = status.get("gpus") or []
    info = next((g for g in gpus if g.get("index") == gpu), None)
    if not common and info is None:
        common = f"cuda:{gpu} is not a GPU on this machine ({len(gpus)} GPU(s))"
    if common:
        reasons["dmabuf"] = common
        reasons["peermem"] = common
        return GpuDirectPreflight("staging", reasons)
    assert info is not None

    major, minor = kernel_version(kernel_release, procfs_root)
    if (major, minor) < (5, 12):
        reasons["dmabuf"] = (
            f"kernel {major}.{minor} has no dmabuf memory regions for RDMA (needs Linux >= 5.12)"
        )
    elif verbs_dmabuf:
        reasons["dmabuf"] = verbs_dmabuf
    elif not status.get("get_handle_for_address_range"):
        reasons["dmabuf"] = (
            "the NVIDIA driver lacks cuMemGetHandleForAddressRange (CUDA 11.7+ drivers have it)"
        )
    elif open_kernel_modules(procfs_root) is False:
        reasons["dmabuf"] = (
            "the proprietary (closed) NVIDIA kernel modules are loaded: dmabuf export needs the "
            "open NVIDIA kernel modules (nvidia-open)"
        )
    elif not info.get("dma_buf"):
        reasons["dmabuf"] = (
            f"cuda:{gpu} reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=0: dmabuf export needs the "
            "open NVIDIA kernel modules (nvidia-open)"
        )
    else:
        reasons["dmabuf"] = ""

    module = Path(sysfs_root) / "module"
    if (module / "nvidia_peermem").exists() or (module / "nv_peer_mem").exists():
        reasons["peermem"] = ""
    else:
        reasons["peermem"] = (
            "the nvidia-peermem kernel module is not loaded (modprobe nvidia-peermem; it ships "
            "with the NVIDIA driver)"
        )
    method = next(m for m in METHODS if not reasons[m])
    return GpuDirectPreflight(method, reasons)


def open_kernel_modules(procfs_root: str | os.PathLike[str] = "/proc") -> bool | None:
    """Whether the loaded NVIDIA kernel modules are the open ones, from the driver's version
    line (``<procfs_root>/driver/nvidia/version``); None when no NVIDIA driver is loaded."""
    try:
        text = (Path(procfs_root) / "driver" / "nvidia" / "version").read_text()
    except OSError:
        return None
    return "Open Kernel Module" in text

"""The libfabric check of ``rdmaxfer doctor``: whether libfabric loads, which of its providers
could carry ``transport="ofi"`` (and why one cannot, as the transport itself decides:
``_core.ofi_providers``), and on EFA machines the EFA NICs nearest each GPU (EFA's usual shape
is 2-4 NICs per GPU: p4d 4 x 100 Gb/s per node, p5 32 x 100 Gb/s)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import _core
from ..errors import UnsupportedError
from ..gpu.topology import list_rdma_devices, nearest_nics
from .doctor_facts import Finding, nvidia_gpus

__all__ = ["check_ofi", "efa_devices"]


def efa_devices(sysfs: Path) -> list[str]:
    """The RDMA devices under ``sysfs`` bound to the ``efa`` driver, by name."""
    out = []
    for name in list_rdma_devices(sysfs):
        driver = sysfs / "class" / "infiniband" / name / "device" / "driver"
        if driver.exists() and Path(os.path.realpath(driver)).name == "efa":
            out.append(name)
    return out


def _providers() -> list[dict[str, Any]] | str:
    try:
        return list(_core.ofi_providers(True))
    except UnsupportedError as exc:
        return str(exc)


def check_ofi(sysfs: Path, providers: list[dict[str, Any]] | str | None = None) -> list[Finding]:
    """libfabric's providers as the ofi transport decides them, and EFA NICs per GPU.

    Args:
        sysfs: root of sysfs (``/sys``; tests pass a fake tree).
        providers: ``_core.ofi_providers(True)``'s list, or why libfabric cannot be loaded
            (default: this machine's).
    """
    found = _providers() if providers is None else providers
    if isinstance(found, str):
        return [
            Finding(
                "ofi.libfabric", "info", "libfabric", found,
                "install libfabric1 (1.17 or newer) for transport='ofi' (EFA and other "
                "libfabric fabrics)",
            )
        ]  # fmt: skip
    hardware = [p for p in found if p["rdma_fabric"]]
    emulated = sorted({p["provider"] for p in found if not p["rdma_fabric"]})
    out = []
    if any(not p["refused"] for p in hardware):
        names = sorted({f"{p['provider']} ({p['domain']})" for p in hardware if not p["refused"]})
        out.append(Finding("ofi.providers", "ok", "libfabric", "RDMA: " + ", ".join(names)))
    else:
        out.append(
            Finding(
                "ofi.providers", "info", "libfabric",
                "no hardware RDMA provider; emulated only: " + (", ".join(emulated) or "none"),
                "transport='ofi' needs an RDMA provider (efa, verbs;ofi_rxm ...), or names "
                "an emulated one in RDMAXFER_OFI_PROVIDER (tests: 'tcp;ofi_rxm')",
            )
        )  # fmt: skip
    for p in found:
        if p["refused"] and p["rdma_fabric"]:
            out.append(Finding("ofi.provider", "warn", p["provider"], p["refused"]))
    out.extend(_efa_per_gpu(sysfs))
    return out


def _efa_per_gpu(sysfs: Path) -> list[Finding]:
    efa = efa_devices(sysfs)
    if not efa:
        return []
    out = [Finding("ofi.efa", "ok", "EFA", f"{len(efa)} EFA NIC(s): {', '.join(efa)}")]
    for bdf in nvidia_gpus(sysfs):
        near = [n for n in nearest_nics(bdf, sysfs) if n.name in efa and n.link in ("PIX", "PXB")]
        subject = f"GPU {bdf}"
        if near:
            names = ", ".join(f"{n.name} ({n.link})" for n in near)
            out.append(
                Finding("ofi.efa", "ok", subject, f"{len(near)} EFA NIC(s) nearest: {names}")
            )
        else:
            out.append(
                Finding(
                    "ofi.efa", "warn", subject, "no EFA NIC behind the same PCIe switch",
                    "GPU memory then crosses the CPU's root complex; check the instance type's "
                    "topology (`nvidia-smi topo -m`)",
                )
            )  # fmt: skip
    return out

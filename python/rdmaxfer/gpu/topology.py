"""Where GPUs and RDMA NICs sit on the PCIe tree, and which GPUDirect registration can work.

Everything here reads sysfs under a root given as a parameter (``/sys`` by default), so tests
build fake trees. Two pieces:

* :func:`link` classifies the path between two PCI devices the way ``nvidia-smi topo -m``
  does: ``PIX`` (through at most one PCIe switch), ``PXB`` (several bridges, no host bridge),
  ``PHB`` (through the PCIe host bridge of one root complex), ``NODE`` (between root
  complexes of one NUMA node), ``SYS`` (across NUMA nodes / sockets). :func:`nearest_nics`
  ranks the RDMA devices (``/sys/class/infiniband``) by that distance from a GPU.
* :func:`preflight` decides how GPU memory is registered for RDMA, in order of preference:
  ``dmabuf``, ``peermem`` (nvidia-peermem), else ``staging``, and says why not the others.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LINK_ORDER",
    "GpuDirectPreflight",
    "NicInfo",
    "kernel_version",
    "link",
    "list_rdma_devices",
    "nearest_nics",
    "normalize_bdf",
    "pci_path",
    "preflight",
]

#: Link kinds from nearest to farthest.
LINK_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")

_BDF = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalize_bdf(bdf: str) -> str:
    """``"00000000:3B:00.0"`` or ``"0000:3b:00.0"`` -> ``"0000:3b:00.0"`` (sysfs spelling).

    Raises:
        ValueError: not a PCI address.
    """
    m = _BDF.match(bdf.strip())
    if m is None:
        raise ValueError(f"{bdf!r} is not a PCI address (domain:bus:device.function)")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def pci_path(bdf: str, sysfs_root: str | os.PathLike[str] = "/sys") -> list[str] | None:
    """The chain of PCI nodes from the root complex down to ``bdf``.

    ``/sys/bus/pci/devices/<bdf>`` links to ``/sys/devices/pci0000:00/0000:00:01.0/.../<bdf>``;
    this returns ``["pci0000:00", "0000:00:01.0", ..., "<bdf>"]``, or None when the device is
    not in this sysfs.
    """
    root = Path(sysfs_root)
    link_path = root / "bus" / "pci" / "devices" / normalize_bdf(bdf)
    if not link_path.exists():
        return None
    real = Path(os.path.realpath(link_path))
    devices = Path(os.path.realpath(root / "devices"))
    try:
        parts = list(real.relative_to(devices).parts)
    except ValueError:
        return None
    # Drop any non-PCI intermediate nodes (some platforms put a bus node above the root).
    while parts and not parts[0].startswith("pci"):
        parts.pop(0)
    return parts or None


def _numa_node(bdf: str, sysfs_root: str | os.PathLike[str]) -> int:
    try:
        text = (Path(sysfs_root) / "bus/pci/devices" / normalize_bdf(bdf) / "numa_node").read_text()
        return int(text.strip())
    except (OSError, ValueError):
        return -1


def link(a: str, b: str, sysfs_root: str | os.PathLike[str] = "/sys") -> str | None:
    """Classify the PCIe path between devices ``a`` and ``b`` (PCI addresses).

    Returns:
        ``"PIX"``, ``"PXB"``, ``"PHB"``, ``"NODE"`` or ``"SYS"`` (see the module docstring),
        or None when either device is missing from sysfs.
    """
    pa, pb = pci_path(a, sysfs_root), pci_path(b, sysfs_root)
    if pa is None or pb is None:
        return None
    if pa[0] != pb[0]:  # different root complexes (host bridges)
        na, nb = _numa_node(a, sysfs_root), _numa_node(b, sysfs_root)
        return "NODE" if na == nb else "SYS"
    common = 0
    for x, y in zip(pa[:-1], pb[:-1], strict=False):
        if x != y:
            break
        common += 1
    if common <= 1:  # only the root complex in common: through the host bridge
        return "PHB"
    # Bridges between the deepest common bridge and each device: a PCIe switch puts one
    # downstream port there, so at most one on each side is "the same switch".
    hops = max(len(pa) - common - 1, len(pb) - common - 1)
    return "PIX" if hops <= 1 else "PXB"


@dataclass(frozen=True)
class NicInfo:
    """An RDMA device: its name (``mlx5_0``), PCI address ("" for software devices) and the
    link from the GPU it was ranked for."""

    name: str
    pci_bus_id: str
    link: str | None
    software: bool


def list_rdma_devices(sysfs_root: str | os.PathLike[str] = "/sys") -> dict[str, str]:
    """RDMA device name -> PCI address ("" for software devices such as rxe/siw)."""
    out: dict[str, str] = {}
    base = Path(sysfs_root) / "class" / "infiniband"
    if not base.is_dir():
        return out
    for dev in sorted(base.iterdir()):
        device_link = dev / "device"
        bdf = ""
        if device_link.exists():
            name = Path(os.path.realpath(device_link)).name
            try:
                bdf = normalize_bdf(name)
            except ValueError:
                bdf = ""
        out[dev.name] = bdf
    return out


def is_software_rdma(name: str, sysfs_root: str | os.PathLike[str] = "/sys") -> bool:
    """True for soft-RoCE (rxe) and soft-iWARP (siw): no PCI device, the CPU moves the bytes."""
    if name.startswith(("rxe", "siw")):
        return True
    return list_rdma_devices(sysfs_root).get(name, "") == ""


def nearest_nics(gpu_bdf: str, sysfs_root: str | os.PathLike[str] = "/sys") -> list[NicInfo]:
    """RDMA devices sorted nearest first from the GPU at ``gpu_bdf`` (software devices last)."""
    nics = []
    for name, bdf in list_rdma_devices(sysfs_root).items():
        kind = link(gpu_bdf, bdf, sysfs_root) if bdf else None
        nics.append(NicInfo(name, bdf, kind, software=not bdf or name.startswith(("rxe", "siw"))))
    rank = {k: i for i, k in enumerate(LINK_ORDER)}
    return sorted(nics, key=lambda n: (n.link is None, rank.get(n.link or "", 99), n.name))


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """``"5.15.0-91-generic"`` -> ``(5, 15)``; (0, 0) when unparseable. Default: this kernel."""
    text = release if release is not None else os.uname().release
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
        for m in ("dmabuf", "peermem", "staging"):
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
    rdma_device: str | None = None,
    cuda_status: dict[str, Any] | None = None,
    gpu: int = 0,
    sysfs_root: str | os.PathLike[str] = "/sys",
    kernel_release: str | None = None,
    verbs_dmabuf: str = "",
) -> GpuDirectPreflight:
    """Decide how GPU memory of GPU ``gpu`` is registered on ``transport``.

    Args:
        transport: ``"tcp"`` or ``"rdma"`` (the engine's transport).
        rdma_device: the RDMA device in use (``"mlx5_0"``, ``"rxe0"``); None: unknown.
        cuda_status: ``_core.cuda_status()`` (driver version, GPUs and their dmabuf support).
        gpu: the GPU's ordinal.
        sysfs_root: where sysfs is (tests pass a fake tree).
        kernel_release: ``uname -r`` (default: this kernel); dmabuf MRs need >= 5.12.
        verbs_dmabuf: "" when libibverbs has ``ibv_reg_dmabuf_mr``, else why not.

    Returns:
        The method to use and, per method, why it is not usable ("" when it is).
    """
    reasons: dict[str, str] = {"staging": ""}
    status = cuda_status or {}
    common = ""
    if transport != "rdma":
        common = (
            f"the {transport} transport moves bytes with the CPU; GPUDirect RDMA needs an RDMA "
            "NIC (use transport='rdma')"
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

    major, minor = kernel_version(kernel_release)
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
    method = next(m for m in ("dmabuf", "peermem", "staging") if not reasons[m])
    return GpuDirectPreflight(method, reasons)

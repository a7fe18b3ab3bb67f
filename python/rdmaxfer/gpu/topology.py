"""Where GPUs and RDMA NICs sit on the PCIe tree.

Everything here reads sysfs under a root given as a parameter (``/sys`` by default), so tests
build fake trees. :func:`link` classifies the path between two PCI devices the way
``nvidia-smi topo -m`` does: ``PIX`` (through at most one PCIe switch), ``PXB`` (several
bridges, no host bridge), ``PHB`` (through the PCIe host bridge of one root complex), ``NODE``
(between root complexes of one NUMA node), ``SYS`` (across NUMA nodes / sockets).
:func:`nearest_nics` ranks the RDMA devices (``/sys/class/infiniband``) by that distance from a
GPU. Which GPUDirect registration can work is decided by :mod:`rdmaxfer.gpu.gpudirect`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LINK_ORDER",
    "NicInfo",
    "is_software_rdma",
    "link",
    "list_rdma_devices",
    "nearest_nics",
    "normalize_bdf",
    "pci_path",
    "rail_device",
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


def nearest_rail(
    gpu_bdf: str, rails: list[str], sysfs_root: str | os.PathLike[str] = "/sys"
) -> int:
    """The index in ``rails`` (an engine's RDMA devices or libfabric domains,
    ``Engine.core.rails()``) of the one
    nearest the GPU at ``gpu_bdf``: PIX/PXB before PHB before NODE before SYS (see
    :func:`nearest_nics`); -1 when no rail has a PCI path to it (software devices, no sysfs)."""
    devices = [rail_device(r) for r in rails]
    for nic in nearest_nics(gpu_bdf, sysfs_root):
        if nic.link is not None and nic.name in devices:
            return devices.index(nic.name)
    return -1


def rail_device(rail: str) -> str:
    """The RDMA device a rail is on: its name, less the endpoint-type suffix libfabric adds to a
    domain's name (``rdmap16s27-rdm`` is EFA device ``rdmap16s27``; ``mlx5_0-xrc``)."""
    for suffix in ("-rdm", "-dgrm", "-xrc"):
        if rail.endswith(suffix):
            return rail[: -len(suffix)]
    return rail

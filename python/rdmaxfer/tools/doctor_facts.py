"""What ``rdmaxfer doctor`` reads and reports: a :class:`Finding`, and small readers of sysfs
and procfs files (every one under a root given by the caller, so tests build fake trees)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..gpu.topology import list_rdma_devices

__all__ = [
    "SEVERITIES",
    "Finding",
    "nic_bdfs",
    "nvidia_gpus",
    "pci_devices",
    "read",
    "read_int",
    "size_text",
    "worst",
]

SEVERITIES = ("ok", "info", "warn", "error")
_NVIDIA = "0x10de"


@dataclass(frozen=True)
class Finding:
    """One result: ``severity`` (ok/info/warn/error), the ``check`` that produced it, what it
    is about (``subject``), what was found (``message``) and how to fix it (``fix``, "" for
    ok)."""

    check: str
    severity: str
    subject: str
    message: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def worst(findings: Iterable[Finding]) -> str:
    """The most severe severity among ``findings`` ("ok" when empty)."""
    return max((f.severity for f in findings), key=SEVERITIES.index, default="ok")


def read(path: Path) -> str | None:
    """The stripped text of ``path``, None when unreadable."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_int(path: Path) -> int | None:
    """The first number in ``path`` (decimal or 0x hex), None when absent."""
    text = read(path)
    try:
        return int(text.split()[0], 0) if text else None
    except ValueError:
        return None


def size_text(n: float) -> str:
    """Bytes as text: ``"1 GiB"``, ``"64 MiB"``, ``"512 B"``."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{int(n)} B"


def pci_devices(sysfs: Path) -> dict[str, Path]:
    """PCI address -> sysfs node of every PCI device."""
    base = sysfs / "bus" / "pci" / "devices"
    if not base.is_dir():
        return {}
    return {p.name: p for p in sorted(base.iterdir())}


def nvidia_gpus(sysfs: Path) -> dict[str, Path]:
    """NVIDIA display/3D controllers: PCI address -> sysfs node."""
    out = {}
    for bdf, node in pci_devices(sysfs).items():
        cls = read(node / "class") or ""
        if read(node / "vendor") == _NVIDIA and cls.startswith(("0x0300", "0x0302")):
            out[bdf] = node
    return out


def nic_bdfs(sysfs: Path) -> dict[str, str]:
    """PCI address -> a name (RDMA device, else netdev) for every PCI NIC."""
    out: dict[str, str] = {}
    for name, bdf in list_rdma_devices(sysfs).items():
        if bdf:
            out.setdefault(bdf, name)
    net = sysfs / "class" / "net"
    if net.is_dir():
        for dev in sorted(net.iterdir()):
            if (dev / "device").exists():
                name = Path(os.path.realpath(dev / "device")).name
                if re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", name):
                    out.setdefault(name, dev.name)
    return out

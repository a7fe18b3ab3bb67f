"""``rdmaxfer doctor``: what on this machine breaks or slows RDMA and GPU transfers.

Every check only reads files under a sysfs root and a procfs root (parameters, ``/sys`` and
``/proc`` by default, so tests build fake trees) and reports :class:`Finding` records with a
severity (``ok``, ``info``, ``warn``, ``error``) and the exact command or setting that fixes
it. Nothing is ever changed.

Checks: locked-memory limit vs what registration needs; RDMA devices, port state, RoCE MTU vs
the netdev MTU, RoCE v2 GIDs; NVIDIA peer memory (nvidia-peermem) and dmabuf (kernel >= 5.12
and the open GPU kernel modules); GPU-NIC PCIe affinity; TCP buffer sysctls, window scaling,
vm.swappiness; IRQ affinity of the NICs' queues; PCIe link width/speed of GPUs and NICs.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SEVERITIES",
    "Finding",
    "build_table",
    "format_table",
    "run_checks",
    "summary",
    "to_json",
    "worst",
]

SEVERITIES = ("ok", "info", "warn", "error")
#: Socket buffer ceiling (bytes) that lets one TCP stream fill ~100 Gb/s at a few ms RTT.
TCP_BUFFER_TARGET = 64 << 20
TCP_BUFFER_LOW = 16 << 20
DEFAULT_NEED = 1 << 30
_IB_MTUS = (4096, 2048, 1024, 512, 256)
#: RoCE v2 headers on top of the IB payload MTU: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 +
#: ICRC 4 (+ RETH 16 for the first packet of a WRITE); the kernel needs netdev MTU >= IB MTU +
#: this to use that IB MTU.
_ROCE_OVERHEAD = 58 + 16
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


# -- reading -----------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text.split()[0], 0) if text else None
    except ValueError:
        return None


def _size(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{int(n)} B"


def _pci_devices(sysfs: Path) -> dict[str, Path]:
    base = sysfs / "bus" / "pci" / "devices"
    if not base.is_dir():
        return {}
    return {p.name: p for p in sorted(base.iterdir())}


def _gpus(sysfs: Path) -> dict[str, Path]:
    """NVIDIA display/3D controllers: PCI address -> sysfs node."""
    out = {}
    for bdf, node in _pci_devices(sysfs).items():
        cls = _read(node / "class") or ""
        if _read(node / "vendor") == _NVIDIA and cls.startswith(("0x0300", "0x0302")):
            out[bdf] = node
    return out


def _rdma_devices(sysfs: Path) -> dict[str, str]:
    """RDMA device -> PCI address ("" for software devices)."""
    out: dict[str, str] = {}
    base = sysfs / "class" / "infiniband"
    if not base.is_dir():
        return out
    for dev in sorted(base.iterdir()):
        bdf = ""
        if (dev / "device").exists():
            name = Path(os.path.realpath(dev / "device")).name
            bdf = (
                name if re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", name) else ""
            )
        out[dev.name] = bdf
    return out


def _nic_bdfs(sysfs: Path) -> dict[str, str]:
    """PCI address -> a name (RDMA device, else netdev) for every PCI NIC."""
    out: dict[str, str] = {}
    for name, bdf in _rdma_devices(sysfs).items():
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


# -- checks ------------------------------------------------------------------------------------
def check_memlock(procfs: Path, need: int, rdma: bool) -> list[Finding]:
    """Locked-memory limit (``ulimit -l``) of this process vs ``need`` bytes."""
    text = _read(procfs / "self" / "limits")
    fix = (
        "raise it: `ulimit -l unlimited` in the launching shell; for logins add "
        "`* - memlock unlimited` to /etc/security/limits.conf; systemd services: "
        "LimitMEMLOCK=infinity; Docker: --ulimit memlock=-1; Kubernetes: run with IPC_LOCK"
    )
    if text is None:
        return [Finding("memlock", "info", "ulimit -l", f"cannot read {procfs}/self/limits")]
    m = re.search(r"^Max locked memory\s+(\S+)\s+(\S+)", text, flags=re.MULTILINE)
    if m is None:
        return [Finding("memlock", "info", "ulimit -l", "no 'Max locked memory' line in limits")]
    soft = m.group(1)
    if soft == "unlimited":
        return [Finding("memlock", "ok", "ulimit -l", "unlimited")]
    limit = int(soft)
    if limit >= need:
        return [Finding("memlock", "ok", "ulimit -l", f"{_size(limit)} >= {_size(need)} needed")]
    severity = "error" if rdma else "warn"
    return [
        Finding(
            "memlock",
            severity,
            "ulimit -l",
            f"{_size(limit)}: registering (pinning) {_size(need)} for RDMA or pinned host "
            "buffers will fail",
            fix,
        )
    ]


def _expected_ib_mtu(netdev_mtu: int) -> int:
    for mtu in _IB_MTUS:
        if netdev_mtu >= mtu + _ROCE_OVERHEAD:
            return mtu
    return 256


def check_rdma(sysfs: Path) -> list[Finding]:
    """RDMA devices, port state, RoCE MTU vs netdev MTU, RoCE v2 GIDs."""
    base = sysfs / "class" / "infiniband"
    devices = sorted(base.iterdir()) if base.is_dir() else []
    if not devices:
        return [
            Finding(
                "rdma.devices",
                "info",
                "RDMA",
                "no RDMA devices: rdmaxfer will use TCP",
                "load the NIC's RDMA driver (e.g. `modprobe mlx5_ib`) and install rdma-core; "
                "to test without hardware: `rdma link add rxe0 type rxe netdev eth0`",
            )
        ]
    out = [Finding("rdma.devices", "ok", "RDMA", ", ".join(d.name for d in devices))]
    for dev in devices:
        ports = sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []
        for port in ports:
            out.extend(_check_port(dev.name, port, sysfs))
    return out


def _check_port(dev: str, port: Path, sysfs: Path) -> list[Finding]:
    subject = f"{dev} port {port.name}"
    out = []
    state = _read(port / "state") or "?"
    phys = _read(port / "phys_state") or "?"
    layer = _read(port / "link_layer") or "?"
    netdevs = sorted(
        {v for f in sorted((port / "gid_attrs" / "ndevs").glob("*")) if (v := _read(f))}
    )
    ndev = netdevs[0] if netdevs else None
    if "ACTIVE" in state:
        out.append(Finding("rdma.port", "ok", subject, f"{state}, {phys}, {layer}"))
    else:
        fix = (
            f"bring the link up: `ip link set dev {ndev} up`; check the cable and switch port"
            if layer == "Ethernet"
            else "check the cable and switch; InfiniBand ports need a subnet manager "
            "(`systemctl start opensm` on one node)"
        )
        out.append(Finding("rdma.port", "error", subject, f"state {state} ({phys})", fix))
    if layer != "Ethernet":
        return out
    mtu = _int(sysfs / "class" / "net" / ndev / "mtu") if ndev else None
    if mtu is None:
        out.append(Finding("rdma.mtu", "info", subject, "no netdev found for this port's GIDs"))
    else:
        ib = _expected_ib_mtu(mtu)
        if ib >= 4096:
            out.append(Finding("rdma.mtu", "ok", subject, f"{ndev} MTU {mtu}: active MTU {ib}"))
        else:
            out.append(
                Finding(
                    "rdma.mtu",
                    "warn",
                    subject,
                    f"{ndev} MTU {mtu} limits the RoCE active MTU to {ib} (4096 needs a "
                    f"netdev MTU >= {4096 + _ROCE_OVERHEAD}): more packets per byte",
                    f"`ip link set dev {ndev} mtu 9000` on both hosts (and jumbo frames on "
                    "the switch ports)",
                )
            )
    out.append(_check_gids(subject, port, ndev))
    return out


def _check_gids(subject: str, port: Path, ndev: str | None) -> Finding:
    v2: list[str] = []
    for type_file in sorted((port / "gid_attrs" / "types").glob("*")):
        if (_read(type_file) or "").lower() != "roce v2":
            continue
        gid = _read(port / "gids" / type_file.name) or ""
        if gid and gid.replace(":", "").strip("0"):
            v2.append(f"{type_file.name}={gid}")
    where = ndev or "the netdev"
    if not v2:
        return Finding(
            "rdma.gid",
            "error",
            subject,
            "no RoCE v2 GID: connections cannot be routed",
            f"give {where} an IP address (`ip addr add 192.0.2.10/24 dev {where}`); RoCE v2 "
            "GIDs follow the addresses",
        )
    routable = [g for g in v2 if not g.split("=", 1)[1].startswith("fe80:")]
    if not routable:
        return Finding(
            "rdma.gid",
            "warn",
            subject,
            f"only link-local RoCE v2 GIDs ({', '.join(v2)})",
            f"add an IPv4/IPv6 address to {where}; rdmaxfer picks the IPv4-mapped GID",
        )
    return Finding("rdma.gid", "ok", subject, f"RoCE v2 GIDs: {', '.join(routable[:3])}")


def _kernel(procfs: Path) -> tuple[int, int] | None:
    text = _read(procfs / "sys" / "kernel" / "osrelease")
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_gpu_memory(sysfs: Path, procfs: Path) -> list[Finding]:
    """nvidia-peermem loaded; dmabuf possible (kernel >= 5.12 and open GPU kernel modules)."""
    version = _read(procfs / "driver" / "nvidia" / "version")
    if version is None:
        return [Finding("gpu.driver", "info", "NVIDIA", "no NVIDIA driver: GPU checks skipped")]
    line = version.splitlines()[0] if version else ""
    out = [Finding("gpu.driver", "ok", "NVIDIA", line[:120])]
    kernel = _kernel(procfs)
    is_open = "Open Kernel Module" in version
    kernel_ok = kernel is not None and kernel >= (5, 12)
    ktext = f"{kernel[0]}.{kernel[1]}" if kernel else "unknown"
    if kernel_ok and is_open:
        out.append(
            Finding("gpu.dmabuf", "ok", "dmabuf", f"kernel {ktext}, open GPU kernel modules")
        )
    else:
        why = []
        if not kernel_ok:
            why.append(f"kernel {ktext} < 5.12")
        if not is_open:
            why.append("the proprietary (closed) GPU kernel modules are loaded")
        out.append(
            Finding(
                "gpu.dmabuf",
                "warn",
                "dmabuf",
                "GPU memory cannot be registered with dmabuf: " + "; ".join(why),
                "use Linux >= 5.12 and the open GPU kernel modules (e.g. `apt install "
                "nvidia-driver-<ver>-open` or the .run installer's `-m=kernel-open`), then "
                "reboot",
            )
        )
    peermem = any((sysfs / "module" / m).exists() for m in ("nvidia_peermem", "nv_peer_mem"))
    if peermem:
        out.append(Finding("gpu.peermem", "ok", "nvidia-peermem", "loaded"))
    else:
        out.append(
            Finding(
                "gpu.peermem",
                "info" if kernel_ok and is_open else "warn",
                "nvidia-peermem",
                "not loaded"
                + (" (dmabuf is available instead)" if kernel_ok and is_open else "")
                + ": without it or dmabuf, GPU buffers are staged through host memory",
                "`modprobe nvidia-peermem`; persist with `echo nvidia-peermem > "
                "/etc/modules-load.d/nvidia-peermem.conf`",
            )
        )
    return out


def _link_kind(a: str, b: str, sysfs: Path) -> str | None:
    """PIX/PXB/PHB/NODE/SYS between two PCI devices (rdmaxfer.topology when present)."""
    try:
        topology = importlib.import_module("rdmaxfer.topology")
    except ImportError:
        topology = None
    if topology is not None and hasattr(topology, "link"):
        kind: str | None = topology.link(a, b, str(sysfs))
        return kind
    return _fallback_link(a, b, sysfs)


def _fallback_link(a: str, b: str, sysfs: Path) -> str | None:
    devices = Path(os.path.realpath(sysfs / "devices"))
    paths = []
    for bdf in (a, b):
        node = sysfs / "bus" / "pci" / "devices" / bdf
        if not node.exists():
            return None
        try:
            parts = list(Path(os.path.realpath(node)).relative_to(devices).parts)
        except ValueError:
            return None
        while parts and not parts[0].startswith("pci"):
            parts.pop(0)
        paths.append(parts)
    pa, pb = paths
    if not pa or not pb:
        return None
    if pa[0] != pb[0]:
        na = _int(sysfs / "bus/pci/devices" / a / "numa_node")
        nb = _int(sysfs / "bus/pci/devices" / b / "numa_node")
        return "NODE" if na == nb else "SYS"
    common = 0
    for x, y in zip(pa[:-1], pb[:-1], strict=False):
        if x != y:
            break
        common += 1
    if common <= 1:
        return "PHB"
    return "PIX" if max(len(pa), len(pb)) - common - 1 <= 1 else "PXB"


_AFFINITY = {
    "PIX": ("ok", "behind the same PCIe switch"),
    "PXB": ("ok", "behind PCIe switches of one root port"),
    "PHB": ("info", "through the CPU's PCIe host bridge"),
    "NODE": ("warn", "on different root complexes of one NUMA node"),
    "SYS": ("warn", "across CPU sockets (the inter-socket link carries every byte)"),
}


def check_affinity(sysfs: Path) -> list[Finding]:
    """GPU-NIC PCIe distance: the nearest RDMA NIC of every NVIDIA GPU."""
    gpus = _gpus(sysfs)
    nics = {bdf: name for name, bdf in _rdma_devices(sysfs).items() if bdf}
    if not gpus or not nics:
        return []
    out = []
    rank = {k: i for i, k in enumerate(_AFFINITY)}
    for gpu in gpus:
        kinds = sorted(
            ((k, n) for bdf, n in nics.items() if (k := _link_kind(gpu, bdf, sysfs))),
            key=lambda kn: rank[kn[0]],
        )
        if not kinds:
            continue
        kind, nic = kinds[0]
        severity, text = _AFFINITY[kind]
        fix = ""
        if severity != "ok":
            fix = (
                f"use a NIC behind the same PCIe switch as GPU {gpu} if the machine has one "
                "(`nvidia-smi topo -m` shows PIX); else pin the process and its memory to the "
                f"NIC's NUMA node (`numactl --cpunodebind=N --membind=N`) and pass "
                f"rdma_device='{nic}'"
            )
        out.append(
            Finding(
                "pcie.affinity", severity, f"GPU {gpu}", f"nearest NIC {nic}: {kind}, {text}", fix
            )
        )
    return out


def check_sysctls(procfs: Path) -> list[Finding]:
    """TCP buffer ceilings, window scaling, vm.swappiness."""
    sys_dir = procfs / "sys"
    out = []
    persist = "persist in /etc/sysctl.d/90-rdmaxfer.conf"
    for key in ("net.core.rmem_max", "net.core.wmem_max"):
        value = _int(sys_dir / key.replace(".", "/"))
        out.append(_buffer_finding(key, value, f"`sysctl -w {key}={TCP_BUFFER_TARGET}`; {persist}"))
    for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
        raw = _read(sys_dir / key.replace(".", "/"))
        fields = raw.split() if raw else []
        text = " ".join(fields) if fields else None
        value = int(fields[2]) if len(fields) == 3 and fields[2].isdigit() else None
        fix = f"`sysctl -w {key}='4096 131072 {TCP_BUFFER_TARGET}'`; {persist}"
        out.append(_buffer_finding(key, value, fix, shown=text))
    scaling = _int(sys_dir / "net" / "ipv4" / "tcp_window_scaling")
    if scaling is None:
        out.append(Finding("sysctl", "info", "net.ipv4.tcp_window_scaling", "not readable"))
    elif scaling:
        out.append(Finding("sysctl", "ok", "net.ipv4.tcp_window_scaling", "1"))
    else:
        out.append(
            Finding(
                "sysctl",
                "error",
                "net.ipv4.tcp_window_scaling",
                "0: every TCP window is capped at 64 KiB",
                f"`sysctl -w net.ipv4.tcp_window_scaling=1`; {persist}",
            )
        )
    swappiness = _int(sys_dir / "vm" / "swappiness")
    if swappiness is None:
        out.append(Finding("sysctl", "info", "vm.swappiness", "not readable"))
    elif swappiness <= 10:
        out.append(Finding("sysctl", "ok", "vm.swappiness", str(swappiness)))
    else:
        out.append(
            Finding(
                "sysctl",
                "info",
                "vm.swappiness",
                f"{swappiness}: under memory pressure the kernel swaps out unpinned buffers "
                "(staging arrays, page cache of served weights) and transfers stall",
                f"`sysctl -w vm.swappiness=10`; {persist}",
            )
        )
    return out


def _buffer_finding(key: str, value: int | None, fix: str, shown: str | None = None) -> Finding:
    text = shown if shown is not None else str(value)
    if value is None:
        return Finding("sysctl", "info", key, "not readable")
    if value >= TCP_BUFFER_TARGET:
        return Finding("sysctl", "ok", key, text)
    severity = "warn" if value < TCP_BUFFER_LOW else "info"
    return Finding(
        "sysctl",
        severity,
        key,
        f"{text}: a TCP socket buffer may grow to {_size(value)} only; one stream then cannot "
        f"fill a fast link at a few ms RTT ({_size(TCP_BUFFER_TARGET)} recommended)",
        fix,
    )


def _cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            out.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            continue
    return out


def check_irqs(sysfs: Path, procfs: Path) -> list[Finding]:
    """IRQ affinity of every PCI NIC's MSI/MSI-X vectors (its queues)."""
    out = []
    for bdf, name in _nic_bdfs(sysfs).items():
        node = sysfs / "bus" / "pci" / "devices" / bdf
        irqs = sorted(int(p.name) for p in (node / "msi_irqs").glob("*") if p.name.isdigit())
        if not irqs:
            continue
        sets = {}
        for irq in irqs:
            text = _read(procfs / "irq" / str(irq) / "smp_affinity_list")
            if text is not None:
                sets[irq] = _cpus(text)
        if not sets:
            continue
        subject = f"{name} ({bdf})"
        local_text = _read(node / "local_cpulist") or "see local_cpulist"
        local = _cpus(_read(node / "local_cpulist") or "")
        used = set().union(*sets.values())
        single = {next(iter(s)) for s in sets.values() if len(s) == 1}
        remote = sorted(used - local) if local else []
        if len(sets) > 1 and all(len(s) == 1 for s in sets.values()) and len(single) == 1:
            cpu = next(iter(single))
            out.append(
                Finding(
                    "irq.affinity",
                    "warn",
                    subject,
                    f"all {len(sets)} queue IRQs on CPU {cpu}: one core handles every interrupt",
                    "run irqbalance (`systemctl enable --now irqbalance`) or spread them over "
                    f"the NIC's local CPUs ({local_text}): "
                    "`echo <cpu> > /proc/irq/<irq>/smp_affinity_list` per queue (Mellanox: "
                    f"`set_irq_affinity_cpulist.sh <cpus> {name}`)",
                )
            )
        elif remote:
            out.append(
                Finding(
                    "irq.affinity",
                    "warn",
                    subject,
                    f"queue IRQs on CPUs {_fmt_cpus(remote)} outside the NIC's NUMA node "
                    f"(local: {_read(node / 'local_cpulist')})",
                    "pin them to the local CPUs: `echo <cpu> > /proc/irq/<irq>/"
                    "smp_affinity_list`, or irqbalance with its NUMA policy",
                )
            )
        else:
            out.append(
                Finding(
                    "irq.affinity",
                    "ok",
                    subject,
                    f"{len(sets)} queue IRQs over CPUs {_fmt_cpus(sorted(used))}",
                )
            )
    return out


def _fmt_cpus(cpus: list[int]) -> str:
    text = ",".join(str(c) for c in cpus[:16])
    return text + (",..." if len(cpus) > 16 else "")


def _gts(text: str | None) -> float | None:
    m = re.match(r"\s*([\d.]+)\s*GT/s", text or "")
    return float(m.group(1)) if m else None


def check_pcie_links(sysfs: Path) -> list[Finding]:
    """Negotiated PCIe width/speed vs the maximum, for GPUs and NICs."""
    out = []
    targets = [(bdf, f"GPU {bdf}", True) for bdf in _gpus(sysfs)]
    targets += [(bdf, f"NIC {name} ({bdf})", False) for bdf, name in _nic_bdfs(sysfs).items()]
    for bdf, subject, is_gpu in targets:
        node = sysfs / "bus" / "pci" / "devices" / bdf
        width, max_width = _int(node / "current_link_width"), _int(node / "max_link_width")
        speed_text, max_speed_text = (
            _read(node / "current_link_speed"),
            _read(node / "max_link_speed"),
        )
        speed, max_speed = _gts(speed_text), _gts(max_speed_text)
        if width is None or max_width is None or speed is None or max_speed is None:
            continue
        now = f"x{width} {speed_text}, max x{max_width} {max_speed_text}"
        if width < max_width:
            out.append(
                Finding(
                    "pcie.link",
                    "warn",
                    subject,
                    f"{now}: running at {width}/{max_width} of its lanes",
                    "reseat the card or move it to a full-width slot; check the BIOS lane "
                    "bifurcation and riser cables",
                )
            )
        elif speed < max_speed:
            if is_gpu:
                out.append(
                    Finding(
                        "pcie.link",
                        "info",
                        subject,
                        f"{now}: GPUs lower their link speed when idle; if it stays low under "
                        "load, it is degraded",
                        "check under load (`nvidia-smi -q -d PCI` during a transfer); if still "
                        "low: reseat, check the slot's generation in the BIOS",
                    )
                )
            else:
                out.append(
                    Finding(
                        "pcie.link",
                        "warn",
                        subject,
                        f"{now}: the link trained below its maximum speed",
                        "reseat the card; check the slot's PCIe generation setting in the BIOS "
                        "and the riser",
                    )
                )
        else:
            out.append(Finding("pcie.link", "ok", subject, now))
    return out


def run_checks(
    *,
    sysfs: str | os.PathLike[str] = "/sys",
    procfs: str | os.PathLike[str] = "/proc",
    need: int = DEFAULT_NEED,
) -> list[Finding]:
    """Run every check; nothing is modified.

    Args:
        sysfs: root of sysfs (``/sys``; tests pass a fake tree).
        procfs: root of procfs (``/proc``); the memlock limit is read from
            ``<procfs>/self/limits``.
        need: bytes that must be lockable for registration (the memlock check), default 1 GiB.

    Returns:
        Findings in check order.
    """
    sys_root, proc_root = Path(sysfs), Path(procfs)
    rdma = bool(_rdma_devices(sys_root))
    checks: list[Callable[[], list[Finding]]] = [
        lambda: check_memlock(proc_root, need, rdma),
        lambda: check_rdma(sys_root),
        lambda: check_gpu_memory(sys_root, proc_root),
        lambda: check_affinity(sys_root),
        lambda: check_pcie_links(sys_root),
        lambda: check_irqs(sys_root, proc_root),
        lambda: check_sysctls(proc_root),
    ]
    out: list[Finding] = []
    for check in checks:
        out.extend(check())
    return out


_STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "error": "bold red"}


def build_table(findings: list[Finding]) -> Any:
    """The findings as a ``rich.table.Table`` (severity coloured)."""
    from rich.table import Table

    table = Table(title="rdmaxfer doctor", expand=False)
    table.add_column("severity", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("subject")
    table.add_column("finding")
    table.add_column("fix")
    for f in findings:
        style = _STYLE.get(f.severity, "")
        table.add_row(f"[{style}]{f.severity}[/]", f.check, f.subject, f.message, f.fix)
    return table


def summary(findings: list[Finding]) -> str:
    """``"12 ok, 3 info, 1 warn, 0 error"``."""
    return ", ".join(f"{sum(f.severity == s for f in findings)} {s}" for s in SEVERITIES)


def format_table(findings: list[Finding], *, width: int = 160) -> str:
    """The findings as a plain-text table (``width`` columns) and a summary line."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    console.print(build_table(findings))
    console.print(summary(findings))
    return buf.getvalue()


def to_json(findings: list[Finding]) -> dict[str, Any]:
    """``{"worst": severity, "findings": [...]}``."""
    return {"worst": worst(findings), "findings": [f.as_dict() for f in findings]}

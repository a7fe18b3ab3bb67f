"""``rdmaxfer doctor``: what on this machine breaks or slows RDMA and GPU transfers.

Every check only reads files under a sysfs root and a procfs root (parameters, ``/sys`` and
``/proc`` by default, so tests build fake trees), the GPU check also the CUDA driver's and
libibverbs' facts (parameters too, this machine's by default), and reports :class:`Finding`
records with a severity (``ok``, ``info``, ``warn``, ``error``) and the exact command or
setting that fixes it. Nothing is ever changed.

Checks: locked-memory limit vs what registration needs; RDMA devices, port state, RoCE MTU vs
the netdev MTU, RoCE v2 GIDs; the traffic class against the NIC's PFC/ECN priorities
(:mod:`.doctor_fabric`); how GPU memory is registered for RDMA (dmabuf, nvidia-peermem or
staging: the decision of :mod:`rdmaxfer.gpu.gpudirect`, which ``rdmaxfer info`` reports too);
CUDA IPC between processes of this host and GPU peer access (the decision of
:func:`rdmaxfer.gpu.report.cuda_ipc_report`, also in ``rdmaxfer info``); GPUDirect Storage
for loads from disk (libcufile, nvidia-fs, open kernel modules: :mod:`.doctor_gds`);
GPU-NIC PCIe affinity; the same-host shm transport (Yama ptrace_scope); fork() and registered
memory (the kernel's copy of pinned pages, libibverbs' fork state: :mod:`.doctor_fork`); TCP
buffer sysctls,
window scaling,
vm.swappiness; IRQ affinity of the NICs' queues; PCIe link width/speed of GPUs and NICs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import _core
from ..gpu import gpudirect
from ..gpu.report import cuda_ipc_report
from ..gpu.topology import list_rdma_devices
from ..memory import cuda
from .doctor_fabric import check_fabric
from .doctor_facts import SEVERITIES, Finding, read, read_int, size_text, worst
from .doctor_fork import check_fork
from .doctor_gds import check_gds
from .doctor_ofi import check_ofi
from .doctor_pci import check_affinity, check_irqs, check_pcie_links

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

#: Socket buffer ceiling (bytes) that lets one TCP stream fill ~100 Gb/s at a few ms RTT.
TCP_BUFFER_TARGET = 64 << 20
TCP_BUFFER_LOW = 16 << 20
DEFAULT_NEED = 1 << 30
_IB_MTUS = (4096, 2048, 1024, 512, 256)
#: RoCE v2 headers on top of the IB payload MTU: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 +
#: ICRC 4 (+ RETH 16 for the first packet of a WRITE); the kernel needs netdev MTU >= IB MTU +
#: this to use that IB MTU.
_ROCE_OVERHEAD = 58 + 16


# -- checks ------------------------------------------------------------------------------------
def check_memlock(procfs: Path, need: int, rdma: bool) -> list[Finding]:
    """Locked-memory limit (``ulimit -l``) of this process vs ``need`` bytes."""
    text = read(procfs / "self" / "limits")
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
        return [
            Finding("memlock", "ok", "ulimit -l", f"{size_text(limit)} >= {size_text(need)} needed")
        ]
    severity = "error" if rdma else "warn"
    return [
        Finding(
            "memlock",
            severity,
            "ulimit -l",
            f"{size_text(limit)}: registering (pinning) {size_text(need)} for RDMA or pinned host "
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
    state = read(port / "state") or "?"
    phys = read(port / "phys_state") or "?"
    layer = read(port / "link_layer") or "?"
    netdevs = sorted(
        {v for f in sorted((port / "gid_attrs" / "ndevs").glob("*")) if (v := read(f))}
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
    mtu = read_int(sysfs / "class" / "net" / ndev / "mtu") if ndev else None
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
        if (read(type_file) or "").lower() != "roce v2":
            continue
        gid = read(port / "gids" / type_file.name) or ""
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


def check_gpu_memory(
    sysfs: Path,
    procfs: Path,
    cuda_status: dict[str, Any] | None = None,
    verbs_dmabuf: str | None = None,
) -> list[Finding]:
    """How GPU memory is registered for RDMA, per GPU: the decision of
    :func:`rdmaxfer.gpu.gpudirect.preflight` (the one ``rdmaxfer info`` and the engine use)
    on the rdma transport, with the first RDMA device under ``sysfs``.

    Args:
        cuda_status: the CUDA driver's facts (default: :func:`rdmaxfer.memory.cuda.status`).
        verbs_dmabuf: why libibverbs has no ``ibv_reg_dmabuf_mr`` ("" when it has; default:
            ``_core.verbs_dmabuf_unavailable()``).
    """
    version = read(procfs / "driver" / "nvidia" / "version")
    if version is None:
        return [Finding("gpu.driver", "info", "NVIDIA", "no NVIDIA driver: GPU checks skipped")]
    line = version.splitlines()[0] if version else ""
    out = [Finding("gpu.driver", "ok", "NVIDIA", line[:120])]
    status = cuda.status() if cuda_status is None else cuda_status
    if verbs_dmabuf is None:
        verbs_dmabuf = _core.verbs_dmabuf_unavailable()
    devices = list(list_rdma_devices(sysfs))
    ordinals = [int(g["index"]) for g in status.get("gpus") or []] or [0]
    for gpu in ordinals:
        check = gpudirect.preflight(
            "rdma",
            rdma_device=devices[0] if devices else None,
            cuda_status=status,
            gpu=gpu,
            sysfs_root=sysfs,
            procfs_root=procfs,
            verbs_dmabuf=verbs_dmabuf,
        )
        out.extend(_gpu_findings(f"cuda:{gpu}", check))
    return out


def _gpu_findings(subject: str, check: gpudirect.GpuDirectPreflight) -> list[Finding]:
    dmabuf, peermem = check.reasons["dmabuf"], check.reasons["peermem"]
    staged = "GPU memory is staged through pinned host buffers (a copy each way)"
    method = {
        "dmabuf": "GPU memory is registered by dmabuf (GPUDirect RDMA)",
        "peermem": "GPU memory is registered through nvidia-peermem (GPUDirect RDMA)",
        "staging": staged,
    }[check.method]
    out = [
        Finding(
            "gpu.method",
            "ok" if check.method != "staging" else "warn",
            subject,
            f"{check.method}: {method}",
            "" if check.method != "staging" else "see gpu.dmabuf and gpu.peermem",
        )
    ]
    if not dmabuf:
        out.append(Finding("gpu.dmabuf", "ok", subject, "dmabuf: available"))
    else:
        out.append(
            Finding(
                "gpu.dmabuf",
                "warn",
                subject,
                f"GPU memory cannot be registered with dmabuf: {dmabuf}",
                "use Linux >= 5.12 and the open GPU kernel modules (e.g. `apt install "
                "nvidia-driver-<ver>-open` or the .run installer's `-m=kernel-open`), then "
                "reboot",
            )
        )
    if not peermem:
        out.append(Finding("gpu.peermem", "ok", subject, "nvidia-peermem: loaded"))
    else:
        out.append(
            Finding(
                "gpu.peermem",
                "info" if not dmabuf else "warn",
                subject,
                f"nvidia-peermem: {peermem}"
                + (" (dmabuf is available instead)" if not dmabuf else "")
                + ": without it or dmabuf, GPU buffers are staged through host memory",
                "`modprobe nvidia-peermem`; persist with `echo nvidia-peermem > "
                "/etc/modules-load.d/nvidia-peermem.conf`",
            )
        )
    return out


def check_shm(procfs: Path, unavailable: str | None = None) -> list[Finding]:
    """The same-host transport: usable here (``unavailable``: the core's reason, "" when
    usable; default: the core's reason for shm), and Yama's ptrace_scope, which
    decides whether two sibling processes may copy between each other (process_vm_readv)."""
    why = _core.available_transports().get("shm", "") if unavailable is None else unavailable
    if why:
        return [
            Finding(
                "shm",
                "warn",
                "shm transport",
                why,
                "transport='auto' connects same-host peers over tcp/rdma instead",
            )
        ]
    scope = read_int(procfs / "sys/kernel/yama/ptrace_scope")
    if scope is not None and scope > 0:
        return [
            Finding(
                "shm",
                "warn",
                "kernel.yama.ptrace_scope",
                f"{scope}: process_vm_readv between sibling processes is refused, so shm "
                "connections between them are refused (transport='auto' falls back to tcp/rdma "
                "and says so)",
                "sysctl -w kernel.yama.ptrace_scope=0 (or use transport='tcp')",
            )
        ]
    return [
        Finding(
            "shm",
            "ok",
            "shm transport",
            "usable: transport='auto' connects peers of this host (same user, network and "
            "PID namespace) over shm (memfd ring + process_vm_readv/writev)",
        )
    ]


def check_cuda_ipc(cuda_status: dict[str, Any] | None = None) -> list[Finding]:
    """GPU memory between processes of this host (shm): whether the driver offers CUDA IPC and,
    per pair of GPUs, whether one can access the other's memory directly: the decision of
    :func:`rdmaxfer.gpu.report.cuda_ipc_report` (the one ``rdmaxfer info`` reports).

    Args:
        cuda_status: the CUDA driver's facts (default: :func:`rdmaxfer.memory.cuda.status`).
    """
    status = cuda.status() if cuda_status is None else cuda_status
    if status["unavailable"]:
        return [
            Finding("gpu.cuda_ipc", "info", "CUDA IPC", f"not checked: {status['unavailable']}")
        ]
    report = cuda_ipc_report(status)
    if report["calls"] != "available":
        return [
            Finding(
                "gpu.cuda_ipc",
                "warn",
                "CUDA IPC",
                f"unavailable: {report['calls']}",
                "upgrade the NVIDIA driver; until then GPU memory between processes of this "
                "host is staged through host memory",
            )
        ]
    out = [
        Finding(
            "gpu.cuda_ipc",
            "ok",
            "CUDA IPC",
            "available: registered GPU memory moves GPU to GPU between processes of this host "
            "(transport 'shm', or 'auto' over tcp)",
        )
    ]
    for pair in report["pairs"]:
        subject = f"cuda:{pair['gpu']} -> cuda:{pair['peer']}"
        if pair["peer_access"] is None:
            out.append(
                Finding(
                    "gpu.peer_access",
                    "info",
                    subject,
                    "the driver cannot say (no cuDeviceCanAccessPeer)",
                )
            )
        elif pair["peer_access"]:
            out.append(Finding("gpu.peer_access", "ok", subject, "peer access possible"))
        else:
            out.append(
                Finding(
                    "gpu.peer_access",
                    "info",
                    subject,
                    "no peer access: CUDA IPC copies between these GPUs go through host "
                    "memory (the driver stages them)",
                    "check `nvidia-smi topo -m` (GPUs under different PCIe root complexes or "
                    "with P2P disabled cannot reach each other)",
                )
            )
    return out


def check_sysctls(procfs: Path) -> list[Finding]:
    """TCP buffer ceilings, window scaling, vm.swappiness."""
    sys_dir = procfs / "sys"
    out = []
    persist = "persist in /etc/sysctl.d/90-rdmaxfer.conf"
    for key in ("net.core.rmem_max", "net.core.wmem_max"):
        value = read_int(sys_dir / key.replace(".", "/"))
        out.append(_buffer_finding(key, value, f"`sysctl -w {key}={TCP_BUFFER_TARGET}`; {persist}"))
    for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
        raw = read(sys_dir / key.replace(".", "/"))
        fields = raw.split() if raw else []
        text = " ".join(fields) if fields else None
        value = int(fields[2]) if len(fields) == 3 and fields[2].isdigit() else None
        fix = f"`sysctl -w {key}='4096 131072 {TCP_BUFFER_TARGET}'`; {persist}"
        out.append(_buffer_finding(key, value, fix, shown=text))
    scaling = read_int(sys_dir / "net" / "ipv4" / "tcp_window_scaling")
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
    swappiness = read_int(sys_dir / "vm" / "swappiness")
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
        f"{text}: a TCP socket buffer may grow to {size_text(value)} only; one stream then cannot "
        f"fill a fast link at a few ms RTT ({size_text(TCP_BUFFER_TARGET)} recommended)",
        fix,
    )


def run_checks(
    *,
    sysfs: str | os.PathLike[str] = "/sys",
    procfs: str | os.PathLike[str] = "/proc",
    need: int = DEFAULT_NEED,
    cuda_status: dict[str, Any] | None = None,
    verbs_dmabuf: str | None = None,
    gds_status: dict[str, str] | None = None,
    ofi_providers: list[dict[str, Any]] | str | None = None,
) -> list[Finding]:
    """Run every check; nothing is modified.

    Args:
        sysfs: root of sysfs (``/sys``; tests pass a fake tree).
        procfs: root of procfs (``/proc``); the memlock limit is read from
            ``<procfs>/self/limits``.
        need: bytes that must be lockable for registration (the memlock check), default 1 GiB.
        cuda_status, verbs_dmabuf: the CUDA driver's and libibverbs' facts for the GPU
            checks (see :func:`check_gpu_memory`; default: this machine's).
        gds_status: what loading libcufile found (see :func:`.doctor_gds.check_gds`; default:
            this machine's).
        ofi_providers: libfabric's providers as the ofi transport decides them, or why
            libfabric cannot be loaded (see :func:`.doctor_ofi.check_ofi`; default: this
            machine's).

    Returns:
        Findings in check order.
    """
    sys_root, proc_root = Path(sysfs), Path(procfs)
    rdma = bool(list_rdma_devices(sys_root))
    checks: list[Callable[[], list[Finding]]] = [
        lambda: check_memlock(proc_root, need, rdma),
        lambda: check_rdma(sys_root),
        lambda: check_fabric(sys_root),
        lambda: check_gpu_memory(sys_root, proc_root, cuda_status, verbs_dmabuf),
        lambda: check_cuda_ipc(cuda_status),
        lambda: check_gds(sys_root, proc_root, gds_status),
        lambda: check_affinity(sys_root),
        lambda: check_pcie_links(sys_root),
        lambda: check_irqs(sys_root, proc_root),
        lambda: check_sysctls(proc_root),
        lambda: check_shm(proc_root),
        lambda: check_fork(proc_root, rdma),
        lambda: check_ofi(sys_root, ofi_providers),
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

"""The PCIe checks of ``rdmaxfer doctor``: GPU-NIC affinity (``nvidia-smi topo -m`` classes,
from :func:`rdmaxfer.gpu.topology.link`), the CPU affinity of the NICs' IRQs, and the PCIe link
width/speed of GPUs and NICs."""

from __future__ import annotations

import re
from pathlib import Path

from ..gpu.topology import link, list_rdma_devices
from .doctor_facts import Finding, nic_bdfs, nvidia_gpus, read, read_int

__all__ = ["check_affinity", "check_irqs", "check_pcie_links"]


_AFFINITY = {
    "PIX": ("ok", "behind the same PCIe switch"),
    "PXB": ("ok", "behind PCIe switches of one root port"),
    "PHB": ("info", "through the CPU's PCIe host bridge"),
    "NODE": ("warn", "on different root complexes of one NUMA node"),
    "SYS": ("warn", "across CPU sockets (the inter-socket link carries every byte)"),
}


def check_affinity(sysfs: Path) -> list[Finding]:
    """GPU-NIC PCIe distance: the nearest RDMA NIC of every NVIDIA GPU."""
    gpus = nvidia_gpus(sysfs)
    nics = {bdf: name for name, bdf in list_rdma_devices(sysfs).items() if bdf}
    if not gpus or not nics:
        return []
    out = []
    rank = {k: i for i, k in enumerate(_AFFINITY)}
    for gpu in gpus:
        kinds = sorted(
            ((k, n) for bdf, n in nics.items() if (k := link(gpu, bdf, sysfs))),
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
    for bdf, name in nic_bdfs(sysfs).items():
        node = sysfs / "bus" / "pci" / "devices" / bdf
        irqs = sorted(int(p.name) for p in (node / "msi_irqs").glob("*") if p.name.isdigit())
        if not irqs:
            continue
        sets = {}
        for irq in irqs:
            text = read(procfs / "irq" / str(irq) / "smp_affinity_list")
            if text is not None:
                sets[irq] = _cpus(text)
        if not sets:
            continue
        subject = f"{name} ({bdf})"
        local_text = read(node / "local_cpulist") or "see local_cpulist"
        local = _cpus(read(node / "local_cpulist") or "")
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
                    f"(local: {read(node / 'local_cpulist')})",
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
    targets = [(bdf, f"GPU {bdf}", True) for bdf in nvidia_gpus(sysfs)]
    targets += [(bdf, f"NIC {name} ({bdf})", False) for bdf, name in nic_bdfs(sysfs).items()]
    for bdf, subject, is_gpu in targets:
        node = sysfs / "bus" / "pci" / "devices" / bdf
        width, max_width = read_int(node / "current_link_width"), read_int(node / "max_link_width")
        speed_text, max_speed_text = (
            read(node / "current_link_speed"),
            read(node / "max_link_speed"),
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

"""``rdmaxfer info``: the transports this machine offers (and why a missing one is missing),
what ``transport="auto"`` picks, the RDMA rails, the locked-memory limit and the GPUs with their
nearest NIC and GPU-memory method, as text or ``--json``; with ``--config``, every setting
(:mod:`.config_report`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import _core, _transports
from ..errors import RdmaxferError
from ..gpu.gds import gds_report
from ..gpu.report import gpu_report
from ..transport.engine import Engine, is_automatic, resolve_transport


def auto_same_host(available: dict[str, str]) -> str:
    """What ``transport="auto"`` uses for a peer on this host, and why not shm when not."""
    network = resolve_transport("auto")
    if not is_automatic("auto"):
        return f"{network} (RDMAXFER_TRANSPORT forces it)"
    companion = _transports.same_host_companion()
    if companion is None:
        return f"{network} (this build has no same-host transport)"
    if available.get(companion):
        return f"{network} ({companion} unavailable: {available[companion]})"
    return (
        f"{companion} when the peer runs as the same user in the same network and PID namespace "
        f"and CMA is allowed; else {network}, saying why"
    )


def cmd_info(args: argparse.Namespace) -> int:
    if getattr(args, "config", False):
        from .config_report import print_config

        print_config(args.json)
        return 0
    available = _core.available_transports()
    opened: dict[str, Engine] = {}
    for name, reason in available.items():
        if not reason:  # usable as far as its check goes; opening an engine tells the rest
            try:
                opened[name] = Engine(name)
            except RdmaxferError as e:
                available[name] = str(e)
    info: dict[str, Any] = {
        "transports": {name: (reason or "available") for name, reason in available.items()},
        "auto_selects": resolve_transport("auto"),
        "auto_same_host": auto_same_host(available),
        "memlock_limit": _core.memlock_limit(),
    }
    details = {}
    rdma_device = None
    for name, opened_engine in opened.items():
        with opened_engine as engine:
            details[name] = engine.describe()
            if _transports.capabilities(name).rails:  # runs on named devices
                info["rdma_rails"] = engine.core.rails()
                words = details[name].split()  # "rdma: device mlx5_0 port 1, ..."
                if "device" in words[:-1]:
                    rdma_device = words[words.index("device") + 1]
    info["details"] = details
    info.setdefault("rdma_rails", [])
    info["gpu"] = gpu_report(available, rdma_device=rdma_device)
    for g in info["gpu"]["gpus"]:  # the engine's rail nearest each GPU (its small transfers)
        near = [n["name"] for n in g["nics"] if n["link"] and n["name"] in info["rdma_rails"]]
        g["nearest_rail"] = near[0] if near else None
    info["gds"] = gds_report()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print("rdmaxfer transports on this machine:")
    for name, reason in available.items():
        state = f"available: {details[name]}" if not reason else f"unavailable: {reason}"
        print(f"  {name:5} {state}")
    print(f"auto selects: {info['auto_selects']}  (override: RDMAXFER_TRANSPORT or --transport)")
    print(f"auto, peers on this host: {info['auto_same_host']}")
    print(f"rdma rails: {', '.join(info['rdma_rails']) or 'none'} (RDMAXFER_RDMA_DEVICES)")
    print(f"locked-memory limit (ulimit -l): {info['memlock_limit']}")
    _print_gpu(info["gpu"])
    _print_gds(info["gds"])
    return 0


def _print_gpu(gpu: dict[str, Any]) -> None:
    if gpu["cuda"] != "available":
        print(f"GPUs: none usable: {gpu['cuda']}")
    else:
        print(f"CUDA driver {gpu['driver_version']}, {len(gpu['gpus'])} GPU(s):")
    for g in gpu["gpus"]:
        print(
            f"  cuda:{g['index']} {g['name']} PCIe {g['pci_bus_id']} "
            f"{g['total_memory'] / 2**30:.0f} GiB, dmabuf {'yes' if g['dma_buf'] else 'no'}"
        )
        if not g["nics"]:
            print("    nearest RDMA NIC: none found in /sys/class/infiniband")
        if g["nearest_rail"]:
            print(f"    nearest rail: {g['nearest_rail']}")
        for nic in g["nics"][:3]:
            where = f"PCIe {nic['pci_bus_id']}" if nic["pci_bus_id"] else "software device"
            print(f"    RDMA NIC {nic['name']} ({where}): {nic['link'] or 'n/a'}")
    ipc = gpu["cuda_ipc"]
    print(f"CUDA IPC (GPU memory between processes of this host, over shm): {ipc['calls']}")
    for pair in ipc["pairs"]:
        access = {True: "yes", False: "no (copies staged by the driver)", None: "unknown"}
        print(
            f"  peer access cuda:{pair['gpu']} -> cuda:{pair['peer']}: "
            f"{access[pair['peer_access']]}"
        )
    for transport, check in gpu["gpudirect"].items():
        print(f"GPU memory on {transport}: {check['method']}")
        for method in ("dmabuf", "peermem"):
            why = check["reasons"].get(method, "")
            print(f"  {method}: {'available' if not why else 'unavailable: ' + why}")


def _print_gds(gds: dict[str, Any]) -> None:
    if gds["available"]:
        version = f" {gds['version']}" if gds["version"] else ""
        print(
            f"GPUDirect Storage (load_weights into GPU memory by cuFileRead): libcufile{version}"
            f" from {gds['path']}"
        )
    else:
        print(
            f"GPUDirect Storage: unavailable: {gds['unavailable']}; load_weights reads GPU "
            "arrays through pinned host buffers"
        )
    nvfs = gds["nvidia_fs"]
    shown = (
        f"loaded{' ' + nvfs['version'] if nvfs['version'] else ''}"
        if nvfs["loaded"]
        else "not loaded"
    )
    print(f"  nvidia-fs: {shown}")
    for need in gds["needs"]:
        print(f"  needs {need}")

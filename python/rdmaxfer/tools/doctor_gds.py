"""``rdmaxfer doctor``'s GPUDirect Storage check: whether libcufile loads (from where, which
version, or why not), the nvidia-fs kernel module and the open GPU kernel modules: the facts
of :func:`rdmaxfer.gpu.gds.gds_report`, which ``rdmaxfer info`` prints too."""

from __future__ import annotations

from pathlib import Path

from ..gpu.gds import INSTALL_CUFILE, LOAD_NVIDIA_FS, OPEN_MODULES, gds_report
from .doctor_facts import Finding

__all__ = ["check_gds"]

SUBJECT = "GPUDirect Storage"


def check_gds(sysfs: Path, procfs: Path, status: dict[str, str] | None = None) -> list[Finding]:
    """GPUDirect Storage for ``load_weights`` into GPU memory.

    Args:
        status: what loading libcufile found (default: ``_core.gds_status()``).
    """
    r = gds_report(sysfs, procfs, status)
    gpu = r["open_kernel_modules"] is not None  # an NVIDIA driver is loaded
    if not r["path"]:
        return [
            Finding(
                "gds.library",
                "warn" if gpu else "info",
                SUBJECT,
                f"{r['unavailable']}: load_weights reads GPU arrays through pinned host buffers",
                INSTALL_CUFILE,
            )
        ]
    version = f" {r['version']}" if r["version"] else ""
    if r["unavailable"]:
        out = [
            Finding(
                "gds.library",
                "warn",
                SUBJECT,
                f"libcufile{version} from {r['path']} loads, but {r['unavailable']}",
                "check the GPU driver and /etc/cufile.json; `gdscheck -p` (from the "
                "nvidia-gds package) says what cuFile lacks",
            )
        ]
    else:
        out = [
            Finding(
                "gds.library",
                "ok",
                SUBJECT,
                f"libcufile{version} from {r['path']}: load_weights reads GPU arrays by cuFileRead",
            )
        ]
    nvfs = r["nvidia_fs"]
    if nvfs["loaded"]:
        shown = f" {nvfs['version']}" if nvfs["version"] else ""
        out.append(Finding("gds.nvidia_fs", "ok", SUBJECT, f"nvidia-fs{shown} loaded"))
    else:
        out.append(
            Finding(
                "gds.nvidia_fs",
                "warn" if gpu else "info",
                SUBJECT,
                "the nvidia-fs kernel module is not loaded: cuFileRead may go through host memory",
                LOAD_NVIDIA_FS,
            )
        )
    if r["open_kernel_modules"] is True:
        out.append(Finding("gds.kernel_modules", "ok", SUBJECT, "open GPU kernel modules"))
    elif r["open_kernel_modules"] is False:
        out.append(
            Finding(
                "gds.kernel_modules",
                "warn",
                SUBJECT,
                "the NVIDIA driver runs its proprietary kernel modules",
                OPEN_MODULES,
            )
        )
    return out

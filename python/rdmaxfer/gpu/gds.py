"""GPUDirect Storage on this machine, for ``rdmaxfer info`` and ``rdmaxfer doctor``: whether
libcufile loads (from where, which version, or why not) and what the direct path from the disk
into GPU memory needs besides it: the nvidia-fs kernel module and the open GPU kernel modules.

``load_weights(device="cuda:N")`` reads GPU destinations with cuFileRead when libcufile loads
and its driver opens; otherwise through page-locked host buffers and host-to-device copies.
Where libcufile loads but nvidia-fs is not loaded, libcufile itself reads through host memory
(its compatibility mode, when its configuration allows it) unless it uses the kernel's PCIe
P2PDMA.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import _core

__all__ = ["INSTALL_CUFILE", "LOAD_NVIDIA_FS", "OPEN_MODULES", "gds_report"]

#: How to get libcufile.
INSTALL_CUFILE = (
    "install the CUDA toolkit's GPUDirect Storage package (libcufile; e.g. `apt install "
    "nvidia-gds`), or point RDMAXFER_CUFILE_LIBRARY at libcufile.so"
)
#: How to load nvidia-fs.
LOAD_NVIDIA_FS = (
    "`modprobe nvidia-fs` (the nvidia-fs module ships with the nvidia-gds package); without "
    "it libcufile reads through host memory (compatibility mode) unless it uses PCIe P2PDMA"
)
#: What the NVIDIA driver needs to be.
OPEN_MODULES = (
    "GPUDirect Storage needs the open GPU kernel modules: install `nvidia-driver-<ver>-open` "
    "(or the .run installer's `-m=kernel-open`) and reboot"
)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def gds_report(
    sysfs_root: str | os.PathLike[str] = "/sys",
    procfs_root: str | os.PathLike[str] = "/proc",
    status: dict[str, str] | None = None,
) -> dict[str, Any]:
    """GPUDirect Storage here.

    Args:
        sysfs_root, procfs_root: sysfs and procfs (tests pass fake trees).
        status: what loading libcufile found (default: ``_core.gds_status()``: ``library``,
            ``path``, ``version``, ``unavailable``).

    Returns:
        ``{"available": bool (load_weights reads GPU arrays by cuFileRead), "library": the
        name tried, "path": the file loaded or None, "version": str or None, "unavailable":
        why not ("" when available), "nvidia_fs": {"loaded": bool, "version": str or None},
        "open_kernel_modules": True, False or None (no NVIDIA driver here), "needs": [what
        is missing for the direct path, each with its fix]}``.
    """
    s = _core.gds_status() if status is None else status
    sysfs, procfs = Path(sysfs_root), Path(procfs_root)
    module = sysfs / "module" / "nvidia_fs"
    nvfs_loaded = module.is_dir() or (procfs / "driver" / "nvidia-fs").is_dir()
    nvfs_version = _read(module / "version") or _read(procfs / "driver" / "nvidia-fs" / "version")
    driver = _read(procfs / "driver" / "nvidia" / "version")
    open_modules = None if driver is None else "Open Kernel Module" in driver
    needs = []
    if not s["path"]:
        needs.append(f"libcufile ({s['library']} does not load): {INSTALL_CUFILE}")
    elif s["unavailable"]:
        needs.append(f"a working libcufile: {s['unavailable']}")
    if not nvfs_loaded and (s["path"] or driver is not None):
        needs.append(f"nvidia-fs not loaded: {LOAD_NVIDIA_FS}")
    if open_modules is False:
        needs.append(f"the NVIDIA driver runs its proprietary kernel modules: {OPEN_MODULES}")
    return {
        "available": not s["unavailable"],
        "library": s["library"],
        "path": s["path"] or None,
        "version": s["version"] or None,
        "unavailable": s["unavailable"],
        "nvidia_fs": {"loaded": nvfs_loaded, "version": nvfs_version},
        "open_kernel_modules": open_modules,
        "needs": needs,
    }

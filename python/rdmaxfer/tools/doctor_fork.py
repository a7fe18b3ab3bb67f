"""``rdmaxfer doctor``'s fork check: what happens to registered (pinned) memory when a process
that registered it calls fork().

Sources: libibverbs' ``ibv_is_fork_initialized()`` (man ibv_fork_init: IBV_FORK_DISABLED 0,
IBV_FORK_ENABLED 1, IBV_FORK_UNNEEDED 2, the last when the kernel itself keeps pinned pages in
the parent); the ``RDMAV_FORK_SAFE`` / ``IBV_FORK_SAFE`` variables that make libibverbs call
``ibv_fork_init()`` (MADV_DONTFORK on every registered page); Linux 5.9's "early COW" of pinned
pages at fork (commit 70e806e4e645), which copies them for the child at once so the parent keeps
the pages the NIC writes.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping
from pathlib import Path

from .doctor_facts import Finding, read

__all__ = ["check_fork", "verbs_fork_state"]

_STATES = {0: "disabled", 1: "enabled", 2: "unneeded"}
_EARLY_COW = (5, 9)


def verbs_fork_state() -> str:
    """libibverbs' fork state ("disabled", "enabled", "unneeded"), or "" when libibverbs (or
    its ``ibv_is_fork_initialized``) is not on this machine."""
    try:
        lib = ctypes.CDLL("libibverbs.so.1")
        query = lib.ibv_is_fork_initialized
    except (OSError, AttributeError):
        return ""
    query.restype = ctypes.c_int
    query.argtypes = []
    return _STATES.get(int(query()), "unknown")


def _kernel(procfs: Path) -> tuple[int, int] | None:
    text = read(procfs / "sys/kernel/osrelease")
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_fork(
    procfs: Path, rdma: bool, environ: Mapping[str, str] | None = None, verbs: str | None = None
) -> list[Finding]:
    """How fork() treats registered memory here: the kernel's pinned-page copy (from
    ``<procfs>/sys/kernel/osrelease``), libibverbs' fork state (``verbs``; default: this
    machine's, :func:`verbs_fork_state`) and RDMAV_FORK_SAFE/IBV_FORK_SAFE in ``environ``
    (default ``os.environ``). A warning only where RDMA devices exist (``rdma``), the kernel
    predates early COW and libibverbs is not fork-safe."""
    env = os.environ if environ is None else environ
    state = verbs_fork_state() if verbs is None else verbs
    kernel = _kernel(procfs)
    safe_vars = [v for v in ("RDMAV_FORK_SAFE", "IBV_FORK_SAFE") if env.get(v)]
    parts = []
    if kernel is None:
        parts.append("kernel release unknown")
    elif kernel >= _EARLY_COW:
        parts.append(
            f"kernel {kernel[0]}.{kernel[1]} copies pinned pages for the child at fork (Linux "
            "5.9+), so the parent keeps the registered pages the NIC writes"
        )
    else:
        parts.append(
            f"kernel {kernel[0]}.{kernel[1]} predates Linux 5.9: a child's first write after "
            "fork() can move the parent's registered pages away from the NIC"
        )
    parts.append(
        f"libibverbs fork support: {state} (ibv_is_fork_initialized)"
        if state
        else "libibverbs not loaded"
    )
    parts.append(
        f"{' and '.join(safe_vars)} set (registered pages MADV_DONTFORK: absent in the child)"
        if safe_vars
        else "RDMAV_FORK_SAFE unset"
    )
    parts.append("engines made before fork() are inert in the child: make a new Engine there")
    risky = rdma and kernel is not None and kernel < _EARLY_COW
    risky = risky and state not in ("enabled", "unneeded") and not safe_vars
    if risky:
        return [
            Finding(
                "fork",
                "warn",
                "fork()",
                "; ".join(parts),
                "export RDMAV_FORK_SAFE=1 before starting processes that register memory and "
                "fork, or upgrade to Linux 5.9+",
            )
        ]
    return [Finding("fork", "ok", "fork()", "; ".join(parts))]

"""How the weights protocols move bytes: every piece of a pull (READs) or a push (WRITEs) in
one batch of one-sided operations (``Endpoint.read_batch`` / ``write_batch``), the push's
version announced by the batch's notification.

A batch merges pieces contiguous on both sides, keeps at most a window of operations in
flight and reports each piece's failure. GPU memory without a GPUDirect registration cannot
be batched (its bytes go through the staging pipeline): those pieces are moved first, one
posted operation each, at most :data:`STAGED_WINDOW` in flight.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import numpy as np

from .. import _core
from .._config import CallLimits
from ..memory.buffer import as_array, device_view
from ..transport.batch import BatchResult, Notify
from ..transport.endpoint import Endpoint
from ..transport.transfer import Transfer

__all__ = ["SLICE_BYTES", "STAGED_WINDOW", "Piece", "move"]

#: With a ``progress`` callback the batch is posted in slices of about this many bytes (two in
#: flight), and progress is reported as each slice completes.
SLICE_BYTES = 16 << 20
#: Staged (GPU, no GPUDirect) operations in flight at once.
STAGED_WINDOW = 256

#: One piece to move: (local array or Buffer, remote region, byte offset in the local array,
#: byte offset in the remote region, bytes).
Piece = tuple[object, _core.Descriptor, int, int, int]
_Entry = tuple[object, _core.Descriptor, int]


def move(
    ep: Endpoint,
    op: str,
    pieces: list[Piece],
    limit: CallLimits,
    progress: Callable[[int, int], None] | None = None,
    notify: Notify | None = None,
) -> None:
    """READ (``op="read"``: remote -> local) or WRITE (``"write"``) every piece, and wait.

    With ``notify`` (WRITEs only) the peer gets the payload from ``Engine.wait_notification``
    once every byte of every piece is in its memory (the staged pieces completed before the
    batch is posted; the notification follows the batch's last WRITE on every lane).

    Raises:
        The first failed piece's error (:meth:`BatchResult.check`: RemoteAccessError,
        InvalidArgumentError...), TransferTimeoutError when nothing moved for
        ``limit.timeout_s``, ConnectionFailedError.
    """
    total = sum(p[4] for p in pieces)
    entries: list[_Entry] = []
    staged: list[Piece] = []
    for piece in pieces:
        entry = _entry(ep, op, piece)
        if entry is None:
            staged.append(piece)
        elif piece[4]:
            entries.append(entry)
    done = _move_staged(ep, op, staged, limit, progress, total)
    slices = _slices(entries) if progress is not None else [entries]
    window: collections.deque[tuple[Transfer[BatchResult], int]] = collections.deque()
    for i, part in enumerate(slices):
        if len(window) >= 2:
            done += _finish(window.popleft(), limit)
            if progress is not None:
                progress(done, total)
        if op == "read":
            transfer = ep.post_read_batch(part)
        else:
            transfer = ep.post_write_batch(part, notify=notify if i == len(slices) - 1 else None)
        window.append((transfer, sum(_nbytes(e) for e in part)))
    while window:
        done += _finish(window.popleft(), limit)
        if progress is not None:
            progress(done, total)


def _finish(posted: tuple[Transfer[BatchResult], int], limit: CallLimits) -> int:
    transfer, nbytes = posted
    transfer.wait(timeout=limit.timeout_s, deadline=limit.deadline_left()).check()
    return nbytes


def _entry(ep: Endpoint, op: str, piece: Piece) -> _Entry | None:
    """The batch entry of ``piece``, or None when it must be staged (GPU memory that has no
    registration the connection moves directly: GPUDirect, or CUDA IPC on shm)."""
    local, remote, offset, remote_offset, nbytes = piece
    writes = op == "read"
    view = device_view(local, writable=writes, what="a weights array")
    if view is None:
        raw = as_array(local, writable=writes, what="a weights array").reshape(-1).view(np.uint8)
        return raw[offset : offset + nbytes], remote, remote_offset
    found = ep.engine.device_local(view, ep.core.transport)
    if found is None:
        return None
    region, base = found
    return (region, base + offset, nbytes), remote, remote_offset


def _nbytes(entry: _Entry) -> int:
    local = entry[0]
    return int(local[2]) if isinstance(local, tuple) else int(np.asarray(local).nbytes)


def _slices(entries: list[_Entry]) -> list[list[_Entry]]:
    """``entries`` cut into runs of about SLICE_BYTES (at least one slice, maybe empty)."""
    out: list[list[_Entry]] = [[]]
    size = 0
    for entry in entries:
        if size >= SLICE_BYTES:
            out.append([])
            size = 0
        out[-1].append(entry)
        size += _nbytes(entry)
    return out


def _move_staged(
    ep: Endpoint,
    op: str,
    pieces: list[Piece],
    limit: CallLimits,
    progress: Callable[[int, int], None] | None,
    total: int,
) -> int:
    """Post each staged piece on its own, at most STAGED_WINDOW in flight; the bytes moved."""
    post = ep.post_read if op == "read" else ep.post_write
    window: collections.deque[Transfer[None]] = collections.deque()
    done = 0

    def wait_oldest() -> None:
        nonlocal done
        transfer = window.popleft()
        transfer.wait(timeout=limit.timeout_s, deadline=limit.deadline_left())
        done += transfer.nbytes
        if progress is not None:
            progress(done, total)

    for local, region, offset, remote, nbytes in pieces:
        if len(window) >= STAGED_WINDOW:
            wait_oldest()
        window.append(post(local, region, offset=offset, remote_offset=remote, nbytes=nbytes))
    while window:
        wait_oldest()
    return done

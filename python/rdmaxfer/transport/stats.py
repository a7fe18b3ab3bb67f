"""What ``Endpoint.stats()`` and ``Engine.stats()`` count: a dict of str -> int.

The C++ core counts (``csrc/core/stats.h``) with relaxed atomics as operations complete, on
every transport (TCP and verbs). An endpoint counts its own operations; an engine sums every
endpoint it made, open or closed, plus connection set-ups that failed. Keys:

``<kind>.ops`` (operations), ``<kind>.bytes`` (bytes)
    Completed operations of this side and the payload bytes they moved, for each kind:
    ``write`` and ``read`` (one-sided; the peer's accesses to this side are counted by the
    peer; on TCP a group of a batch's small WRITEs that travelled as one frame counts once),
    ``send`` and ``recv`` (two-sided messages; ``send.bytes`` is the array's size, not
    counting metadata; a rendezvous's notified WRITE counts here), ``ctrl``
    (control messages this side sent: RTS, EAGER (with its payload), CTS, REJECT, and GOODBYE
    on TCP; bytes on the wire).
``lane<N>.bytes`` (bytes), ``lane<N>.chunks`` (count)
    Payload bytes, and the parts (chunks, work requests) that carried them, per lane: TCP
    stream or verbs QP ``N``, for lanes 0 .. the highest used. Without failures, the lanes'
    bytes add up to ``write.bytes + read.bytes + send.bytes + recv.bytes``.
``errors.<kind>`` (count)
    Operations of that kind that failed (an endpoint closed by its own side does not count);
    ``errors.connection``: endpoints that ended on a failure (lost peer, timeout, transport or
    protocol error; not a close by either side); ``errors.connect`` / ``errors.accept``:
    set-ups that failed (engine only).
``retries`` (count)
    Connection attempts that were refused (nothing listening yet) and tried again.
``credit_stalls`` (count)
    Times a sender began to wait: for a credit (verbs: more messages posted than the peer's
    window of unanswered ones) or for room in a socket (TCP: the send buffer was full).
``io_linger_us`` (microseconds)
    ``Engine.stats()`` only: time the engine's I/O threads (TCP loops, shm readers) spent
    polling for their next event instead of sleeping, the CPU that the poll mode trades for
    latency (``docs/poll-modes.md``): ``adaptive`` lingers at most 20 % of each thread's time
    (on more than one CPU), ``busy`` 20 ms after every event, ``event`` never. Verbs completion
    threads are not counted.
``recv_buffers.posted``, ``recv_buffers.allocated`` (count)
    ``Engine.stats()`` of an open rdma engine only, a level rather than a counter: the receive
    buffers (16 KiB each) posted for two-sided messages now, and allocated, over every rail's
    shared receive queue and the QPs that post their own (no SRQ, or ``RDMAXFER_SRQ=0``). With
    the SRQ they follow the traffic, not the number of peers.
"""

from __future__ import annotations

from collections.abc import Mapping


def nonzero(stats: Mapping[str, int]) -> dict[str, int]:
    """The counters of ``stats`` that are not 0, in their order."""
    return {name: value for name, value in stats.items() if value}

"""Handles on posted operations, and the bridge from the engine's notifications to asyncio.

A :class:`Transfer` is what ``Endpoint.post_send/post_recv/post_write/post_read`` return. It
keeps every Python object the operation reads or writes alive until the operation is terminal,
and releases the temporary registrations it made then. Wait for it with :meth:`Transfer.wait`
(blocking), :meth:`Transfer.wait_async` / ``await transfer`` (asyncio) or poll
:meth:`Transfer.done`.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

from .. import _core
from .._config import resolve_deadline, resolve_timeout
from ..errors import EndpointClosedError, RdmaxferError, TransferTimeoutError
from ..memory.region import MemoryRegion
from .notifications import Notifications

__all__ = [
    "CLEANUP_TIMEOUT_S",
    "MIN_WAIT_S",
    "HeaderStep",
    "Inflight",
    "Transfer",
    "TransferOwner",
    "WaitLimits",
    "posted",
]

T = TypeVar("T")

#: Bound on the waits made while cleaning up (abort, deregistration of temporary regions).
CLEANUP_TIMEOUT_S = 5.0
#: A bound with less than this left counts as run out (no wait of a few microseconds).
MIN_WAIT_S = 1e-4

#: An endpoint's in-flight table polls every transfer once it holds this many (then twice as
#: many as remain), so finished ones release their memory even when no one waits on them.
_SWEEP_MIN = 64

_DIRECTION = {"send": "to", "recv": "from", "write": "to", "read": "from"}

# Called with the finished header request of a recv; posts and returns the data request.
HeaderStep = Callable[["Transfer[Any]", _core.Request], _core.Request]


class TransferOwner(Protocol):
    """What a Transfer needs from the endpoint it was posted on (an
    :class:`~rdmaxfer.transport.endpoint.Endpoint`, which sits above this module): the peer's
    address, the ``_core.Endpoint``, the engine's notifications, aborting, handing back the
    temporary registrations and forgetting a transfer once it is terminal."""

    @property
    def peer(self) -> str: ...

    @property
    def core(self) -> _core.Endpoint: ...

    @property
    def notifications(self) -> Notifications: ...

    def abort_core(self, reason: str, *, timed_out: bool) -> None: ...

    def untrack(self, transfer: Transfer[Any]) -> None: ...

    def release_temps(
        self, temps: list[MemoryRegion], timeout_s: float | None = ..., *, failed: bool = ...
    ) -> None: ...


class Transfer(Generic[T]):
    """One posted operation on an :class:`~rdmaxfer.transport.endpoint.Endpoint`.

    Lifecycle: posted (in its endpoint's in-flight table; a recv first waits for the message
    header, then places the bytes) -> done or failed (terminal: resources released; ``wait()``
    returns the result or raises the error, every time it is called).

    The result is None for send, write and read; for recv it is the array received into.
    """

    def __init__(
        self,
        endpoint: TransferOwner,
        op: str,
        nbytes: int,
        request: _core.Request,
        *,
        keep: list[object],
        temps: list[MemoryRegion],
        result: T,
        on_header: HeaderStep | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._op = op
        self._nbytes = nbytes
        self._req = request
        self._keep = keep
        self._temps = temps
        self._result = result
        self._on_header = on_header
        # Run once the last request is done; raising fails the transfer (checksums).
        self._on_done: Callable[[], None] | None = None
        self._lock = threading.RLock()
        self._finished = False
        self._error: BaseException | None = None
        self.id = -1  # set by the endpoint's in-flight table

    # -- public ----------------------------------------------------------------------------
    @property
    def op(self) -> str:
        """``"send"``, ``"recv"``, ``"write"`` or ``"read"``."""
        return self._op

    @property
    def nbytes(self) -> int:
        """Bytes moved by the operation (for a recv, known once the header arrived; else -1)."""
        return self._nbytes

    @property
    def endpoint(self) -> TransferOwner:
        """The endpoint the operation was posted on."""
        return self._endpoint

    def done(self) -> bool:
        """True once terminal (done or failed). Never blocks; for a recv whose header has
        arrived it posts the data placement."""
        return self._advance()

    def failed(self) -> bool:
        """True once terminal with an error."""
        return self._advance() and self._error is not None

    def wait(self, timeout: float | None = None, *, deadline: float | None = None) -> T:
        """Block until the operation is terminal.

        Args:
            timeout: the inactivity bound, in seconds (default: ``RDMAXFER_TIMEOUT`` or 60):
                the wait fails once the operation made no progress for that long (no byte
                sent, placed or acknowledged; counted from the later of the last progress and
                the start of this wait), so a large transfer on a slow link is not cut short
                while bytes are still moving. A recv still waiting for its message fails when
                none arrived within ``timeout``.
            deadline: an optional bound on the whole wait, in seconds from now (None: none).
                When either runs out while bytes are moving, the endpoint is aborted (its
                stream can no longer be trusted); while a recv still waits for a message, the
                wait is withdrawn and the endpoint stays usable.

        Returns:
            The received array for a recv, else None.

        Raises:
            TransferTimeoutError: no progress for ``timeout`` seconds, or ``deadline`` passed
                (the message gives the figures: seconds, bytes moved of the total).
            ConnectionFailedError: the peer closed or reset the connection.
            ProtocolError: e.g. the receiver rejected the message (dtype/shape mismatch).
            RemoteAccessError: the peer refused a one-sided access.
            InvalidArgumentError: a recv(out=...) whose out does not match the message, or a
                bad ``timeout``/``deadline``.
            KeyboardInterrupt: Ctrl-C (within 0.1 s); the operation is withdrawn or its
                endpoint aborted first.
        """
        return self.wait_within(WaitLimits(resolve_timeout(timeout), resolve_deadline(deadline)))

    def wait_within(self, limits: WaitLimits) -> T:
        """Internal: :meth:`wait` within ``limits`` (a wait that started earlier, on this transfer's
        current request, goes on under the same bounds)."""
        while not self._advance():
            request = self._req
            left = limits.left(request)
            if left <= 0:
                if not request.done():
                    self._time_out(request, limits)
                continue
            try:
                request.wait(left)
            except BaseException as exc:  # Ctrl-C: the operation cannot be left half-done
                self.interrupt(request, f"interrupted by {type(exc).__name__}")
                raise
        return self._outcome()

    async def wait_async(self, timeout: float | None = None, *, deadline: float | None = None) -> T:
        """Asyncio twin of :meth:`wait` (same arguments, result and errors).

        Cancelling the awaiting task withdraws a recv that still waits for its message; an
        operation already moving bytes goes on in the background (its memory stays alive).
        The steps taken once a request is done (placing an announced message: registering or
        allocating its destination; verifying a checksum; copying a checksummed message up to
        GPU memory; handing back temporary registrations) run in the loop's default executor,
        never on the event loop.
        """
        import asyncio  # loaded already: this coroutine runs in an event loop

        limits = WaitLimits(resolve_timeout(timeout), resolve_deadline(deadline))
        loop = asyncio.get_running_loop()
        hub = self._endpoint.notifications
        while not self._finished:
            request = self._req
            if request.done():
                await loop.run_in_executor(None, self._advance)
                continue
            left = limits.left(request)
            if left <= 0:
                if not request.done():
                    self._time_out(request, limits)
                continue
            future = hub.watch(request, loop)
            try:
                await asyncio.wait_for(future, left)
            except asyncio.TimeoutError:
                pass  # the next turn looks at the progress made meanwhile
            except asyncio.CancelledError:
                self._cancel(request)
                raise
            finally:
                hub.unwatch(request.id, future)
        return self._outcome()

    def __await__(self) -> Generator[Any, None, T]:
        return self.wait_async().__await__()

    def __repr__(self) -> str:
        state = "pending"
        if self._finished:
            state = "failed" if self._error is not None else "done"
        return f"<Transfer {self._op} {self._nbytes} bytes {state}>"

    # -- for the package's own modules (receive, batch, blocking): not part of the API --------
    def add_resources(self, keep: list[object], temps: list[MemoryRegion]) -> None:
        """Internal: objects to keep alive and temporary registrations to hand back when the
        transfer ends."""
        self._keep.extend(keep)
        self._temps.extend(temps)

    def set_result(self, result: T, nbytes: int) -> None:
        """Internal: what ``wait()`` returns, and the byte count, once known (a receive)."""
        self._result = result
        self._nbytes = nbytes

    def current_result(self) -> T:
        """Internal: the result as set so far (a receive's ``out``, before its header)."""
        return self._result

    def set_on_done(self, callback: Callable[[], None]) -> None:
        """Internal: run ``callback`` once the last request is done; its raising fails the
        transfer (a checksum that does not match)."""
        self._on_done = callback

    def _outcome(self) -> T:
        if self._error is not None:
            raise self._error
        return self._result

    def _advance(self) -> bool:
        """Move the state machine as far as it goes without blocking; True when terminal."""
        with self._lock:
            while not self._finished:
                request = self._req
                if not request.done():
                    return False
                try:
                    request.check()
                except BaseException as exc:
                    self._finish(exc)
                    break
                step, self._on_header = self._on_header, None
                if step is None:
                    verify, self._on_done = self._on_done, None
                    try:
                        if verify is not None:
                            verify()
                    except BaseException as exc:
                        self._finish(exc)
                        break
                    self._finish(None)
                    break
                try:
                    self._req = step(self, request)
                except BaseException as exc:
                    self._finish(exc)
            return True

    def _peer_text(self) -> str:
        try:
            return f"{_DIRECTION.get(self._op, 'with')} {self._endpoint.peer}"
        except RdmaxferError:
            return "(peer unknown)"

    def _time_out(self, request: _core.Request, limits: WaitLimits) -> None:
        """The wait ran out with ``request`` still pending: withdraw or abort, then finish."""
        with self._lock:
            if self._finished:
                return
            bound = limits.expired_text(waiting_for_message=self._on_header is not None)
            if self._on_header is not None:  # still waiting for the message header
                self._withdraw_header(request, "the receiver timed out")
                error = TransferTimeoutError(
                    f"recv: no message arrived {self._peer_text()} {bound} "
                    "(the endpoint stays usable); is the peer sending?"
                )
            else:
                moved = request.moved
                hint = self._send_hint() if self._op == "send" else ""
                self._endpoint.abort_core(
                    f"{self._op} of {self._nbytes} bytes timed out: {bound}", timed_out=True
                )
                request.wait(CLEANUP_TIMEOUT_S)
                error = TransferTimeoutError(
                    f"{self._op} of {self._nbytes} bytes {self._peer_text()} {bound}: "
                    f"{moved} of {self._nbytes} bytes moved in {limits.elapsed():.3g} s{hint}; "
                    "the endpoint was aborted (connect again to go on; is the peer alive and "
                    "reading?)"
                )
            self._finish(error)

    def _send_hint(self) -> str:
        """Why a send may wait: it completes once the receiver has placed it, and sends past
        the flow-control window wait for the receiver's recv calls (verbs)."""
        attrs = self._endpoint.core.attributes()
        waiting = attrs.get("sends_waiting_for_credit")
        if waiting:
            return (
                f": the receiver is not receiving (a send completes when the peer calls recv); "
                f"{waiting} sends were waiting for flow-control credit, beyond the "
                f"{attrs.get('credit_window')} messages the peer holds unreceived"
            )
        return ": a send completes when the receiver has received it; is the peer calling recv?"

    def _withdraw_header(self, request: _core.Request, reason: str) -> None:
        """Withdraw a pending header wait; a header that matched meanwhile is rejected so the
        sender does not wait for bytes nobody will place."""
        core = self._endpoint.core
        with contextlib.suppress(RdmaxferError):
            if core.cancel_recv_header(request):
                return
        request.wait(CLEANUP_TIMEOUT_S)
        if request.done() and not request.failed():
            msg_id = request.message()[0]
            with contextlib.suppress(RdmaxferError):
                core.reject(msg_id, reason)

    def interrupt(self, request: _core.Request, reason: str) -> None:
        """Internal: a wait on ``request`` was interrupted (Ctrl-C): withdraw a receive still
        waiting for its header, else abort the operation (it cannot be left half-done)."""
        with self._lock:
            if self._finished:
                return
            if self._on_header is not None:  # still waiting for the message header
                self._withdraw_header(request, f"the receiver was {reason}")
                self._finish(RdmaxferError(f"{self._op} was {reason} (endpoint still open)"))
            else:
                self._endpoint.abort_core(f"{self._op} {reason}", timed_out=False)
                request.wait(CLEANUP_TIMEOUT_S)
                self._finish(EndpointClosedError(f"{self._op} was {reason}; endpoint aborted"))

    def _cancel(self, request: _core.Request) -> None:
        with self._lock:
            if self._finished:
                return
            if self._on_header is not None:  # still waiting for the message header
                self._withdraw_header(request, "the receiving task was cancelled")
                self._finish(RdmaxferError("recv was cancelled before a message arrived"))
            else:  # bytes are moving: let it finish in the background, then release its memory
                with contextlib.suppress(RdmaxferError):
                    self._endpoint.notifications.call_when_done(request, self.done)

    def _settle(self, error: BaseException) -> None:
        """After the endpoint closed: finish with the request's own error or ``error``."""
        if self._advance():
            return
        with self._lock:
            if not self._req.wait(CLEANUP_TIMEOUT_S) or not self._advance():
                self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self._error = error
            temps, self._temps = self._temps, []
            self._on_header = None
        self._endpoint.release_temps(temps, CLEANUP_TIMEOUT_S, failed=error is not None)
        self._keep = []
        self._endpoint.untrack(self)


async def posted(post: Callable[[], Transfer[T]]) -> Transfer[T]:
    """Run ``post`` (an ``Endpoint.post_*`` call) in the running loop's default executor
    and return its Transfer: posting may block (synchronizing a GPU producer's stream,
    ``cuStreamSynchronize``; registering memory; copying a checksummed GPU message to
    host memory), which must not hold up the event loop. If the awaiting task is
    cancelled meanwhile, the operation is cancelled as :meth:`Transfer.wait_async` does once it
    is posted (a recv still waiting for its message is withdrawn)."""
    import asyncio  # loaded already: this coroutine runs in an event loop

    future = asyncio.get_running_loop().run_in_executor(None, post)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_cancel_posted)
        raise


def _cancel_posted(future: Any) -> None:
    """Cancel the Transfer a cancelled :func:`posted` call made (if the post
    succeeded)."""
    if not future.cancelled() and future.exception() is None:
        transfer = future.result()
        transfer._cancel(transfer._req)


class WaitLimits:
    """The bounds of one wait: inactivity (``timeout_s``: no progress for that long) and an
    optional overall deadline (``deadline_s`` from the start of the wait: ``started``, a
    ``time.monotonic()`` reading, or now)."""

    def __init__(
        self, timeout_s: float, deadline_s: float | None, started: float | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self._started = time.monotonic() if started is None else started
        self._by_deadline = False

    def elapsed(self) -> float:
        """Seconds since the wait started."""
        return time.monotonic() - self._started

    def left(self, request: _core.Request) -> float:
        """Seconds the wait may still block on ``request`` (<= 0: a bound ran out)."""
        elapsed = self.elapsed()
        left = self.timeout_s - min(request.idle(), elapsed)
        self._by_deadline = False
        if self.deadline_s is not None and self.deadline_s - elapsed < left:
            left = self.deadline_s - elapsed
            self._by_deadline = True
        return left if left > MIN_WAIT_S else 0.0

    def fresh(self) -> float:
        """:meth:`left` for a request about to be posted (idle for no time), without asking it:
        the whole timeout, or less when the deadline comes first."""
        self._by_deadline = False
        left = self.timeout_s
        if self.deadline_s is not None and self.deadline_s - self.elapsed() < left:
            left = self.deadline_s - self.elapsed()
            self._by_deadline = True
        return left if left > MIN_WAIT_S else 0.0

    def expired_text(self, *, waiting_for_message: bool = False) -> str:
        """Which bound ran out, in words (after :meth:`left` returned 0)."""
        if self._by_deadline:
            verb = "" if waiting_for_message else "did not complete "
            return f"{verb}within its deadline of {self.deadline_s:g} s"
        if waiting_for_message:
            return f"within {self.timeout_s:g} s (timeout)"
        return f"made no progress for {self.timeout_s:g} s (timeout)"


class Inflight:
    """An endpoint's posted transfers not yet observed terminal, by id. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: dict[int, Transfer[Any]] = {}
        self._ids = itertools.count(1)
        self._sweep_at = _SWEEP_MIN

    def __len__(self) -> int:
        with self._lock:
            return len(self._table)

    def add(self, transfer: Transfer[Any]) -> None:
        """Give ``transfer`` its id and hold it (polling all of them now and then)."""
        with self._lock:
            transfer.id = next(self._ids)
            self._table[transfer.id] = transfer
            sweep = len(self._table) >= self._sweep_at
            candidates = list(self._table.values()) if sweep else []
        for other in candidates:
            other.done()
        if sweep:
            with self._lock:
                self._sweep_at = max(_SWEEP_MIN, 2 * len(self._table))

    def remove(self, transfer: Transfer[Any]) -> None:
        """Forget ``transfer`` (it is terminal)."""
        with self._lock:
            self._table.pop(transfer.id, None)

    def settle_all(self, error: BaseException) -> None:
        """Fail every held transfer with ``error`` (the endpoint closed)."""
        with self._lock:
            transfers = list(self._table.values())
        for transfer in transfers:
            transfer._settle(error)

"""The bridge from an engine's completion notifications (``notify_fd``) to asyncio futures
and to callbacks run by a progress thread."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import _core
from ..errors import EndpointClosedError, RdmaxferError

if TYPE_CHECKING:
    import asyncio

__all__ = ["Notifications"]


class Notifications:
    """Acts on the engine's completion notifications (``notify_fd``).

    Two kinds of watchers: asyncio futures (resolved on their own loop) and callbacks (run in
    the thread that reads the notifications). Per (engine, event loop) ``notify_fd`` is added
    as a reader once; a progress thread, started on the first callback, reads it too, so that
    a posted recv places its bytes as soon as its message is announced even when no one
    waits on it (the sender waits for that). Whoever reads a notification dispatches it.

    Lifecycle: open -> closed (engine close: every watcher resolved, readers removed, thread
    stopped).
    """

    def __init__(self, core: _core.Engine) -> None:
        self._core = core
        self._fd = core.notify_fd
        self._lock = threading.Lock()
        self._waiters: dict[int, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._callbacks: dict[int, list[Callable[[], object]]] = {}
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = (
            weakref.WeakKeyDictionary()
        )
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(
        self, request: _core.Request, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[None]:
        """A future of ``loop`` resolved (with None) once ``request`` is terminal."""
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._closed:
                raise EndpointClosedError("the engine is closed")
            if loop not in self._loops:
                loop.add_reader(self._fd, self._drain_on_loop)
                self._loops[loop] = self._fd
            self._waiters.setdefault(request.id, []).append((loop, future))
        request.watch(self._core)
        if request.done() and not future.done():
            future.set_result(None)
        return future

    def unwatch(self, request_id: int, future: asyncio.Future[None]) -> None:
        """Forget a waiter (after it resolved, timed out or was cancelled)."""
        with self._lock:
            waiters = self._waiters.get(request_id)
            if waiters is None:
                return
            waiters[:] = [(lp, fut) for lp, fut in waiters if fut is not future]
            if not waiters:
                del self._waiters[request_id]

    def call_when_done(self, request: _core.Request, callback: Callable[[], object]) -> None:
        """Run ``callback()`` once ``request`` is terminal, in whichever thread reads the
        notification (it must not block)."""
        with self._lock:
            if self._closed:
                raise EndpointClosedError("the engine is closed")
            self._callbacks.setdefault(request.id, []).append(callback)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rdmaxfer-progress", daemon=True
                )
                self._thread.start()
        request.watch(self._core)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._closed:
            try:
                ready = poller.poll(1000)
            except OSError:
                return
            if ready:
                self._drain()

    def _drain(self) -> None:
        callbacks, ready = self._take()
        _run_callbacks(callbacks)
        _resolve_all(ready)

    def _drain_on_loop(self) -> None:
        """The event loop's reader: it resolves the futures; the callbacks (which place an
        announced message: registering memory, allocating or copying GPU memory) run in the
        loop's default executor, off the loop."""
        callbacks, ready = self._take()
        if callbacks:
            import asyncio  # loaded already: this runs in an event loop

            try:
                asyncio.get_running_loop().run_in_executor(None, _run_callbacks, callbacks)
            except RuntimeError:
                # The loop is finishing (asyncio.run shut its executor down) but still reads
                # notify_fd; the callbacks it took may belong to another loop's requests, so
                # they run here rather than being lost.
                _run_callbacks(callbacks)
        _resolve_all(ready)

    def _take(
        self,
    ) -> tuple[
        list[Callable[[], object]], list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]
    ]:
        """Read the notifications; the callbacks and waiters of the requests they name."""
        try:
            ids = self._core.drain_notifications()
        except RdmaxferError:
            ids = []
        ready: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        callbacks: list[Callable[[], object]] = []
        with self._lock:
            for request_id in ids:
                ready.extend(self._waiters.pop(request_id, []))
                callbacks.extend(self._callbacks.pop(request_id, []))
        return callbacks, ready

    def close(self) -> None:
        """Dispatch what is pending (the endpoints are closed, so every watched request is
        terminal), resolve the remaining waiters and stop reading."""
        self._drain()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ready = [w for waiters in self._waiters.values() for w in waiters]
            callbacks = [c for cbs in self._callbacks.values() for c in cbs]
            self._waiters.clear()
            self._callbacks.clear()
            loops = list(self._loops.items())
            self._loops = weakref.WeakKeyDictionary()
        _run_callbacks(callbacks)
        _resolve_all(ready)
        with contextlib.suppress(OSError):
            os.write(self._fd, (1).to_bytes(8, sys.byteorder))  # wake the progress thread
        for loop, fd in loops:
            if loop.is_closed():
                continue
            if _running_loop() is loop:
                loop.remove_reader(fd)
            else:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(loop.remove_reader, fd)


def _run_callbacks(callbacks: list[Callable[[], object]]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # a callback records its own errors; never kill the reader
            traceback.print_exc()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    if "asyncio" not in sys.modules:  # no event loop can be running without it
        return None
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _set_none(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _resolve_all(ready: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    current = _running_loop()
    for loop, future in ready:
        if loop is current:
            _set_none(future)
        elif not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set_none, future)

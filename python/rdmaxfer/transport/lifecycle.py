"""What happens to open engines when the interpreter exits.

A process may end (its script returns, ``sys.exit``, an unhandled exception, a signal handler
that raises ``SystemExit``) with engines, endpoints, weight servers and transfers still open,
and with daemon threads blocked in the core (``Endpoint.recv``, ``Engine.accept``, a
``Transfer.wait``). An ``atexit`` hook registered when this module is imported (by ``import
rdmaxfer``) runs before Python finalizes, after the non-daemon threads ended:

1. ``_core.begin_exit()``: from now on a thread other than the exiting one that comes back
   from a core call, or starts one, sleeps until the process ends instead of running Python
   again (during finalization it would be killed by ``pthread_exit`` inside C++ frames, which
   aborts the process). Its wait never returns, so it raises nothing.
2. every service with threads of its own (a :class:`~rdmaxfer.weights.WeightServer`, a
   :class:`~rdmaxfer.weights.WeightReceiver`) is told to stop, so that its threads end quietly;
3. every open engine's core is closed: connections aborted, which wakes and fails every wait,
   and the transport's threads stopped and joined.

Nothing else is released (the process is ending); no Python lock is taken, so a daemon thread
that held one when it parked cannot hold the exit up. The process then exits with its own
status. See docs/lifecycle.md.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Protocol

from .. import _core

__all__ = ["Stoppable", "at_exit", "track_engine", "track_service"]


class Stoppable(Protocol):
    def stop_at_exit(self) -> None:
        """Tell the object's threads to end, without waiting for them or taking locks."""


_services: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_engines: weakref.WeakSet[Stoppable] = weakref.WeakSet()


def track_service(service: Stoppable) -> None:
    """Have ``service.stop_at_exit()`` called at exit, before any engine closes (a weak
    reference: tracking does not keep the service alive)."""
    _services.add(service)


def track_engine(engine: Stoppable) -> None:
    """Have ``engine.stop_at_exit()`` (which closes its core) called at exit, after the
    services stopped (a weak reference)."""
    _engines.add(engine)


def at_exit() -> None:
    """The exit hook (registered with :mod:`atexit` at import); runs once."""
    _core.begin_exit()
    for group in (_services, _engines):
        for item in list(group):
            try:
                item.stop_at_exit()
            except Exception:  # the process is ending: nothing more to do about it
                pass
        group.clear()


atexit.register(at_exit)

"""Timeouts, deadlines and ``host:port`` addresses (private).

The settings they default from (``RDMAXFER_TIMEOUT``...) are declared in :mod:`rdmaxfer.options`.
"""

from __future__ import annotations

import math
import time

from .errors import InvalidArgumentError
from .options import DEFAULT_TIMEOUT_S, default_timeout

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENV_SECRET",
    "ENV_TIMEOUT",
    "ENV_TRANSPORT",
    "CallLimits",
    "Deadline",
    "default_timeout",
    "format_address",
    "parse_address",
    "resolve_deadline",
    "resolve_timeout",
]

ENV_TIMEOUT = "RDMAXFER_TIMEOUT"
ENV_TRANSPORT = "RDMAXFER_TRANSPORT"
ENV_SECRET = "RDMAXFER_SECRET"


def _check_timeout(value: float, source: str) -> None:
    if not math.isfinite(value) or value < 0:
        raise InvalidArgumentError(
            f"{source}: a timeout must be a finite number of seconds >= 0 (every wait is bounded)"
        )


def resolve_timeout(timeout: float | None) -> float:
    """Return ``timeout`` in seconds, or the default (``RDMAXFER_TIMEOUT`` or 60 s) when None.

    Raises:
        InvalidArgumentError: the value (or the environment variable) is not a finite number
            of seconds >= 0.
    """
    if timeout is None:
        return default_timeout()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidArgumentError(f"timeout={timeout!r}: a timeout is a number of seconds")
    value = float(timeout)
    if not 0 <= value < math.inf:  # NaN fails too
        _check_timeout(value, f"timeout={timeout!r}")
    return value


def resolve_deadline(deadline: float | None) -> float | None:
    """Return ``deadline`` (seconds for a whole call) validated, or None (no overall bound).

    Raises:
        InvalidArgumentError: not a finite number of seconds >= 0.
    """
    if deadline is None:
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
        raise InvalidArgumentError(f"deadline={deadline!r}: a deadline is a number of seconds")
    if not math.isfinite(deadline) or deadline < 0:
        raise InvalidArgumentError(
            f"deadline={deadline!r} must be a finite number of seconds >= 0, or None for none"
        )
    return float(deadline)


class Deadline:
    """A point in time (monotonic clock) that a sequence of bounded waits must not pass."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._at = time.monotonic() + timeout_s

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._at - time.monotonic())


class CallLimits:
    """The bounds of one call that connects and then transfers: ``timeout`` (seconds, default
    ``RDMAXFER_TIMEOUT`` or 60) bounds connecting or accepting, a handshake-like exchange, and
    the inactivity of every transfer; ``deadline`` (seconds, None: none) optionally bounds the
    whole call.

    Raises:
        InvalidArgumentError: a bad ``timeout`` or ``deadline``.
    """

    def __init__(self, timeout: float | None, deadline: float | None) -> None:
        self.timeout_s = resolve_timeout(timeout)
        deadline_s = resolve_deadline(deadline)
        self._deadline = None if deadline_s is None else Deadline(deadline_s)

    def connect_s(self) -> float:
        """The bound of the next connect or accept: ``timeout``, within the deadline."""
        if self._deadline is None:
            return self.timeout_s
        return min(self.timeout_s, self._deadline.remaining())

    def deadline_left(self) -> float | None:
        """What is left of the deadline (seconds), for the next wait; None without one."""
        return None if self._deadline is None else self._deadline.remaining()


def parse_address(
    address: str | int, port: int | None = None, *, default_host: str | None = None
) -> tuple[str, int]:
    """Split ``"host:port"``, ``"[v6]:port"``, ``":port"`` or (``host``, ``port``).

    ``default_host`` is used when the host part is empty (``":5555"`` or a bare port); when it
    is None a host is required.

    Raises:
        InvalidArgumentError: no host where one is required, or a port outside 0..65535.
    """
    if isinstance(address, int) and not isinstance(address, bool):
        host, port_value = "", address
    elif not isinstance(address, str):
        raise InvalidArgumentError(
            f"address {address!r} must be a string such as '10.0.0.2:5555' or ':5555'"
        )
    elif port is not None:
        host, port_value = address, port
    else:
        text = address.strip()
        if text.startswith("["):
            close = text.find("]")
            if close < 0 or not text[close + 1 :].startswith(":"):
                raise InvalidArgumentError(
                    f"address {address!r}: write an IPv6 address as '[::1]:5555'"
                )
            host, port_text = text[1:close], text[close + 2 :]
        elif ":" in text:
            host, _, port_text = text.rpartition(":")
            if ":" in host:
                raise InvalidArgumentError(
                    f"address {address!r}: write an IPv6 address as '[::1]:5555'"
                )
        elif text.isdigit():
            host, port_text = "", text
        else:
            raise InvalidArgumentError(
                f"address {address!r} has no port; write it as 'host:port', e.g. '{text}:5555'"
            )
        try:
            port_value = int(port_text)
        except ValueError:
            raise InvalidArgumentError(
                f"address {address!r}: port {port_text!r} is not a number"
            ) from None
    if isinstance(port_value, bool) or not 0 <= port_value <= 65535:
        raise InvalidArgumentError(f"address {address!r}: port {port_value} is not in 0..65535")
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        if default_host is None:
            raise InvalidArgumentError(
                f"address {address!r} has no host; write it as 'host:port', e.g. "
                f"'127.0.0.1:{port_value}'"
            )
        host = default_host
    return host, port_value


def format_address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

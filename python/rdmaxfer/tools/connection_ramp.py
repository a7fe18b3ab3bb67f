"""How many connections a download uses (start with a few, double while the total rate grows)
and how many bytes each ranged request asks for (as many as a connection moves in
:data:`RANGE_S` seconds at the rate measured).

Servers and CDNs often cap each connection (nginx ``limit_rate``, object stores); a link or the
client's CPU caps the total. :class:`ConnectionRamp` measures the total rate over a short window
at each connection count and doubles the count while the rate grows by :data:`GAIN` or more;
then it stops, and goes back to the previous count when the last doubling gained less than
:data:`KEEP`: a server that caps each connection gets more connections, one that does not
keeps the few it started with.

:class:`RangeSizer` sizes the ranges: a whole number of the download's chunks (the resume
grid), one chunk first, then the power-of-two multiple closest below what one connection
receives in :data:`RANGE_S` seconds at the rate measured, at most :data:`MAX_RANGE` bytes; near
the end never more than the bytes left over twice the connections (no connection holds the
end alone). A fast server gets few, large requests; a slow or capped one small ones that
spread over the connections.

Times in seconds, rates in bytes per second.
"""

from __future__ import annotations

from dataclasses import dataclass, field

START_CONNECTIONS = 4
"""Connections an adaptive download starts with."""
MAX_ADAPTIVE_CONNECTIONS = 32
"""Most connections an adaptive download grows to."""
GAIN = 1.3
"""The rate must grow by this factor after a doubling for the next doubling."""
KEEP = 1.1
"""A doubling that grew the rate by less than this factor is undone."""
SETTLE_S = 0.1
"""Seconds after a change before the rate is measured (connects, first bytes)."""
WINDOW_S = 0.25
"""Seconds over which each count's rate is measured."""
RANGE_S = 0.5
"""Seconds of one connection's transfer a range aims at."""
MAX_RANGE = 64 << 20
"""Most bytes an adaptive range asks for (unless one chunk is larger)."""


@dataclass
class RampStep:
    """One connection count the ramp tried: from ``t`` seconds on, ``connections`` open,
    ``rate`` bytes/s measured at that count (0 until measured)."""

    t: float
    connections: int
    rate: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"t_s": round(self.t, 3), "connections": self.connections,
                "GB_per_s": round(self.rate / 1e9, 4)}  # fmt: skip


@dataclass
class ConnectionRamp:
    """The connection count of one download.

    ``start`` connections first; while ``adaptive``, the count doubles (up to ``limit``) each
    time the rate measured over :data:`WINDOW_S` grew by :data:`GAIN` over the previous
    count's; once it did not, the count stays (or goes back to the previous one when the rate
    grew by less than :data:`KEEP`), as it does when ``limit`` is reached.
    """

    start: int
    limit: int
    adaptive: bool = True
    steps: list[RampStep] = field(default_factory=list)
    _settled: bool = False
    _mark_t: float = 0.0
    _mark_bytes: int = -1

    def __post_init__(self) -> None:
        self.start = max(1, min(self.start, self.limit))
        self.steps.append(RampStep(0.0, self.start))
        self._mark_t = SETTLE_S
        self._settled = not self.adaptive or self.start >= self.limit

    @property
    def target(self) -> int:
        """Connections to keep open now."""
        return self.steps[-1].connections

    @property
    def most(self) -> int:
        """The largest count tried."""
        return max(s.connections for s in self.steps)

    def sample(self, t: float, total_bytes: int) -> int:
        """Feed the time since the start and the bytes received so far; returns
        :attr:`target`."""
        if self._settled or t < self._mark_t:
            return self.target
        if self._mark_bytes < 0:  # the settle time just ended: the window starts here
            self._mark_t, self._mark_bytes = t, total_bytes
            return self.target
        if t - self._mark_t < WINDOW_S:
            return self.target
        step = self.steps[-1]
        step.rate = (total_bytes - self._mark_bytes) / (t - self._mark_t)
        previous = self.steps[-2].rate if len(self.steps) > 1 else 0.0
        if previous and step.rate < previous * GAIN:
            self._settled = True
            if step.rate < previous * KEEP:  # the last doubling bought nothing: undo it
                self.steps.append(RampStep(t, self.steps[-2].connections, previous))
            return self.target
        grown = min(self.limit, step.connections * 2)
        self.steps.append(RampStep(t, grown))
        self._settled = grown >= self.limit
        self._mark_t, self._mark_bytes = t + SETTLE_S, -1
        return grown


@dataclass
class RangeSizer:
    """The bytes each ranged request asks for: whole ``chunk`` multiples.

    Adaptive: ``chunk`` first; every :data:`WINDOW_S` the rate per running connection is
    measured (averaged with the previous figure) and, when what one connection receives in
    :data:`RANGE_S` seconds is outside half to twice the range, the range becomes the
    largest power-of-two multiple of ``chunk`` within it (at least ``chunk``, at most
    :data:`MAX_RANGE` or one chunk when that is larger). Fixed (``adaptive=False``): always
    ``chunk``. ``steps`` lists ``(t, bytes)`` at each change.
    """

    chunk: int
    adaptive: bool = True
    steps: list[tuple[float, int]] = field(default_factory=list)
    _mark_t: float = -1.0
    _mark_bytes: int = 0
    _rate: float = 0.0

    def __post_init__(self) -> None:
        self.steps.append((0.0, self.chunk))

    @property
    def size(self) -> int:
        """Bytes per range now."""
        return self.steps[-1][1]

    @property
    def largest(self) -> int:
        """The largest range size used."""
        return max(size for _, size in self.steps)

    def sample(self, t: float, total_bytes: int, running: int) -> int:
        """Feed the time since the start, the bytes received so far and the transfers running;
        returns :attr:`size`."""
        if not self.adaptive or running < 1:
            return self.size
        if self._mark_t < 0 or total_bytes < self._mark_bytes:
            self._mark_t, self._mark_bytes = t, total_bytes
            return self.size
        if t - self._mark_t < WINDOW_S:
            return self.size
        rate = (total_bytes - self._mark_bytes) / (t - self._mark_t) / running
        self._mark_t, self._mark_bytes = t, total_bytes
        self._rate = rate if self._rate == 0 else (self._rate + rate) / 2  # smoothed
        want = min(self._rate * RANGE_S, max(MAX_RANGE, self.chunk))
        if self.size <= want < 2 * self.size or self.size // 2 <= want < self.size:
            return self.size  # within a factor of two: kept (no flapping on noise)
        size = self.chunk
        while size * 2 <= want:
            size *= 2
        if size != self.size:
            self.steps.append((t, size))
        return self.size

    def take(self, left: int, connections: int) -> int:
        """Chunks the next range covers, with ``left`` bytes still to ask for over
        ``connections`` connections: :attr:`size` in chunks, and near the end no more than
        ``left / (2 * connections)`` (at least one)."""
        if not self.adaptive:
            return 1
        share = left // (2 * max(1, connections))
        return max(1, min(self.size, share) // self.chunk)

    def as_list(self) -> list[dict[str, float]]:
        return [{"t_s": round(t, 3), "bytes": size} for t, size in self.steps]

"""How many connections a download uses: start with a few, double while the total rate grows.

Servers and CDNs often cap each connection (nginx ``limit_rate``, object stores); a link or the
client's CPU caps the total. :class:`ConnectionRamp` measures the total rate over a short window
at each connection count and doubles the count while the rate grows by :data:`GAIN` or more;
then it stops, and goes back to the previous count when the last doubling gained less than
:data:`KEEP`: a server that caps each connection gets more connections, one that does not
keeps the few it started with.

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

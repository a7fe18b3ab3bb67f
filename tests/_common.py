"""Names shared by the host test modules (kept out of conftest.py, which tests/rdma also has)."""

from __future__ import annotations

from dataclasses import dataclass

from rdmaxfer import Endpoint, Engine

#: Slack allowed past a timeout before "raised within the timeout" counts as failed.
MARGIN_S = 5.0


@dataclass
class Pair:
    """Two engines in this process connected over loopback."""

    server: Engine
    client: Engine
    a: Endpoint  # the client's endpoint (connected)
    b: Endpoint  # the server's endpoint (accepted)
    port: int

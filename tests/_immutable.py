"""Pulls racing a publisher that writes into what it published (tests/test_weights_immutable.py
and its verbs twin in tests/rdma): every pull's bytes must be exactly the version it reports.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xxhash

from rdmaxfer import Engine, pull_weights

#: Bound on the whole race (the pulls take well under a second each, even on a loaded host).
RACE_S = 300.0

Digests = dict[str, int]


def digests(arrays: Mapping[str, Any]) -> Digests:
    """XXH3-64 of each array's bytes, by name."""
    return {
        name: xxhash.xxh3_64_intdigest(np.ascontiguousarray(a).data) for name, a in arrays.items()
    }


def race(
    address: str,
    make_client: Callable[[], Engine],
    publish_step: Callable[[int], None],
    *,
    pullers: int = 3,
    pulls: int = 8,
) -> list[tuple[int, Digests]]:
    """``pullers`` threads, each with its own engine, pull everything ``pulls`` times while the
    calling thread runs ``publish_step(1)``, ``publish_step(2)``... until they are done; no
    pull starts before the first step returned. Returns (version, digests) of every pull.

    Raises what a puller raised, or AssertionError when the race outlasts RACE_S.
    """
    results: list[tuple[int, Digests]] = []
    errors: list[BaseException] = []
    first_step = threading.Event()

    def puller() -> None:
        try:
            with make_client() as engine:
                first_step.wait(RACE_S)
                for _ in range(pulls):
                    got = pull_weights(address, engine=engine, timeout=60)
                    results.append((got.version, digests(got)))
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=puller) for _ in range(pullers)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + RACE_S
    step = 0
    try:
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            step += 1
            publish_step(step)
            first_step.set()
    finally:
        first_step.set()
        for thread in threads:
            thread.join(RACE_S)
    if errors:
        raise errors[0]
    assert len(results) == pullers * pulls, f"the race ran out of {RACE_S:g} s"
    return results


def torn(results: list[tuple[int, Digests]], expected: Mapping[int, Digests]) -> list[str]:
    """The pulls whose bytes are not those of the version they report."""
    wrong = []
    for version, got in results:
        want = expected.get(version)
        if got != want:
            names = sorted(n for n in got if want is None or got[n] != want.get(n))
            wrong.append(f"version {version}: tensors {names} differ")
    return wrong


def overwrite(arrays: Mapping[str, np.ndarray], rng: np.random.Generator) -> None:
    """New random bytes into each array, in place."""
    for arr in arrays.values():
        raw = arr.reshape(-1).view(np.uint8)
        raw[:] = rng.integers(0, 256, size=raw.size, dtype=np.uint8)

"""rdmaxfer.metrics: every Engine.stats() key exported to Prometheus, per engine and per peer,
read at scrape time; `rdmaxfer serve --metrics-port` serves them over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

import rdmaxfer
from rdmaxfer import Engine, UnsupportedError

prometheus_client = pytest.importorskip("prometheus_client", reason="pip install prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from rdmaxfer.metrics import EngineCollector, family_of  # noqa: E402


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, labels): value} of a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
          ) -> float:  # fmt: skip
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in found.items() if n == name and want <= lab)


def scrape(collector: EngineCollector) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    return samples(prometheus_client.generate_latest(registry).decode())


def test_every_stats_key_is_exported_and_counts_a_write() -> None:
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 300_001, dtype=np.uint8)
    with Engine("tcp") as server, Engine("tcp") as client:
        port = server.listen("127.0.0.1", 0)
        ep = client.connect("127.0.0.1", port, timeout=30)
        peer_ep = server.accept(timeout=30)
        target = np.zeros_like(data)
        region = server.register(target, access="rw")
        collector = EngineCollector([client, server])
        before = scrape(collector)
        ep.write(data, region.descriptor(), timeout=30)
        after = scrape(collector)
        engine_label = f"{client.engine_id:016x}"
        mine = {"engine": engine_label}
        assert total(after, "rdmaxfer_bytes_total", op="write", **mine) - total(
            before, "rdmaxfer_bytes_total", op="write", **mine
        ) == len(data)
        assert total(after, "rdmaxfer_operations_total", op="write", **mine) == 1
        assert total(after, "rdmaxfer_peer_bytes_total", op="write", peer=ep.peer, **mine) == len(
            data
        )
        assert total(after, "rdmaxfer_endpoints", **mine) == 1
        assert total(after, "rdmaxfer_connections_total", link="tcp", **mine) == 1
        assert target.tobytes() == data.tobytes()
        # Every key of both engines' stats is a sample of its family, with its value.
        for engine in (client, server):
            for key, value in engine.stats().items():
                family, label = family_of(key)
                labels = {"engine": f"{engine.engine_id:016x}", "transport": "tcp"}
                if family.label is not None:
                    labels[family.label] = str(label)
                got = total(scrape(collector), "rdmaxfer_" + family.name, **labels)
                assert got >= value, (key, got, value)  # counters only grow between reads
        peer_ep.close()
        ep.close()
        assert total(scrape(collector), "rdmaxfer_peer_bytes_total", **mine) == 0  # closed
    assert scrape(collector) == {}  # closed engines are left out


def test_unknown_keys_get_a_counter_of_their_own() -> None:
    family, label = family_of("new.thing")
    assert (family.name, family.kind, label) == ("new_thing_total", "counter", None)
    assert family_of("lane3.chunks")[0].name == "lane_chunks_total"
    assert family_of("lane3.chunks")[1] == "3"
    assert family_of("errors.accept")[1] == "accept"


def test_without_prometheus_client_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setitem(sys.modules, "prometheus_client.core", None)
    with pytest.raises(UnsupportedError, match=r"pip install 'rdmaxfer\[metrics\]'"):
        EngineCollector()


def test_importing_metrics_loads_no_prometheus_client() -> None:
    code = "import sys, rdmaxfer.metrics; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_serve_metrics_port_is_scraped_over_http(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    weights = {"w": rng.standard_normal((128, 64)).astype(np.float32)}
    path = tmp_path / "w.safetensors"
    save_file(weights, str(path))
    command = [sys.executable, "-m", "rdmaxfer", "serve", str(path), "--port", "0",
               "--transport", "tcp", "--metrics-port", "0", "--max-clients", "2"]  # fmt: skip
    server = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert ", metrics on http://127.0.0.1:" in line, line
        address = line.split(" on ", 1)[1].split(",", 1)[0]
        url = line.rsplit(" ", 1)[1].strip()
        before = samples(httpx.get(url, timeout=30).text)
        assert total(before, "rdmaxfer_connections_total") == 0
        pulled = rdmaxfer.pull_weights(address, transport="tcp", timeout=30)
        np.testing.assert_array_equal(pulled["w"], weights["w"])
        after = samples(httpx.get(url, timeout=30).text)
        assert total(after, "rdmaxfer_connections_total", link="tcp") == 1
        assert total(after, "rdmaxfer_bytes_total") > total(before, "rdmaxfer_bytes_total")
        assert total(after, "rdmaxfer_operations_total") > total(
            before, "rdmaxfer_operations_total"
        )
        rdmaxfer.pull_weights(address, transport="tcp", timeout=30)  # the last client
        server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0

"""Weight sync on TCP: shards of the MiniLM file landing in the caller's arrays, selective
pulls, errors naming the tensor before any byte moves, versions that never mix while updates
run, ``min_version``, and the push path (trainer -> inference)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from rdmaxfer import (
    Endpoint,
    Engine,
    InvalidArgumentError,
    TransferTimeoutError,
    UnsupportedError,
    pull_weights,
    push_weights,
    receive_weights,
)
from rdmaxfer.tools.cli_weights import default_model_file
from rdmaxfer.weights import WeightServer

ROWS = "encoder.layer.0.intermediate.dense.weight"  # [1536, 384] F32
SQUARE = "encoder.layer.0.attention.self.key.weight"  # [384, 384] F32
BIAS = "encoder.layer.0.attention.self.key.bias"  # [384] F32
IDS = "embeddings.position_ids"  # [1, 512] I64


def model_file() -> Path:
    try:
        return default_model_file()
    except FileNotFoundError as exc:  # a required test input, not an optional one
        pytest.fail(f"{exc} (the README's test command installs it)")


@pytest.fixture(scope="module")
def minilm() -> tuple[Path, dict[str, np.ndarray]]:
    path = model_file()
    return path, load_file(str(path))


def sentinel(shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    return np.full(shape, 12345, dtype=dtype)


def test_shards_land_in_the_callers_arrays_bit_exact(
    minilm: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, ref = minilm
    shards = {
        ROWS: np.s_[256:512],  # a row range: one READ
        SQUARE: np.s_[:, 96:192],  # a column block: one READ per row
        BIAS: np.s_[100:200:3],  # a step: one READ per element
        IDS: np.s_[0, 17:40],  # an int drops the axis
    }
    into = {
        name: sentinel(ref[name][index].shape, ref[name].dtype) for name, index in shards.items()
    }
    with Engine("tcp") as engine, WeightServer(path, transport="tcp") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        got = pull_weights(address, engine=engine, into=into, shard=shards, timeout=60)
        assert got.version == 1 and set(got) == set(shards)
        for name, index in shards.items():
            assert got[name] is into[name]  # filled in place
            np.testing.assert_array_equal(into[name], ref[name][index], err_msg=name)
        # 1 + 384 + 34 + 1 READs, gathered (TCP: up to 64 pieces per channel operation), and
        # at least one operation per tensor.
        reads = engine.stats()["read.ops"]
        assert len(shards) <= reads <= 1 + 384 // 64 + 1 + 1 + len(shards), reads
        # The same row range without into= comes back as a new array; one READ.
        alone = pull_weights(address, engine=engine, names=[ROWS], shard={ROWS: np.s_[1000:1100]})
        assert engine.stats()["read.ops"] == reads + 1
        assert list(alone) == [ROWS] and alone[ROWS].shape == (100, 384)
        np.testing.assert_array_equal(alone[ROWS], ref[ROWS][1000:1100])


def test_four_row_quarters_of_every_tensor_rebuild_the_file(
    minilm: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, ref = minilm
    with WeightServer(path, transport="tcp") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        parts = []
        for k in range(4):
            shard = {}
            for name, arr in ref.items():
                rows = arr.shape[0]
                shard[name] = np.s_[k * rows // 4 : (k + 1) * rows // 4]
            parts.append(pull_weights(address, transport="tcp", shard=shard, timeout=60))
    for name, arr in ref.items():
        whole = np.concatenate([part[name] for part in parts])
        assert whole.dtype == arr.dtype and whole.shape == arr.shape, name
        np.testing.assert_array_equal(whole, arr, err_msg=name)


def test_a_pull_whose_server_closed_before_the_done_message_returns_its_bytes(
    minilm: tuple[Path, dict[str, np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server closes its end once "done" lands; over verbs its GOODBYE can beat the SEND's
    # completion, so the client sees the SEND fail. Here the server closes before "done" goes
    # out: every READ has completed, so the pull returns its bytes.
    path, ref = minilm
    send = Endpoint.send
    failed: list[str] = []

    def send_after_server_closed(ep: Endpoint, data: object, **kwargs: object) -> None:
        if bytes(np.asarray(data)).find(b'"done"') >= 0:
            server.close()
            deadline = time.monotonic() + 30
            while not ep.closed and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ep.closed, "the client endpoint never saw the server close"
            try:
                send(ep, data, **kwargs)  # type: ignore[arg-type]
            except ConnectionError as exc:
                failed.append(str(exc))
                raise
            return
        send(ep, data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Endpoint, "send", send_after_server_closed)
    with WeightServer(path, transport="tcp") as server:
        server.start()
        got = pull_weights(f"127.0.0.1:{server.port}", transport="tcp", names=[ROWS, BIAS])
    assert failed, "the done message did not fail: this test did not make the race"
    assert sorted(got) == sorted([ROWS, BIAS])
    for name, arr in got.items():
        np.testing.assert_array_equal(arr, ref[name], err_msg=name)


def test_selective_pulls_by_list_and_predicate(
    minilm: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, ref = minilm
    with Engine("tcp") as engine, WeightServer(path, transport="tcp") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        listed = pull_weights(address, engine=engine, names=[BIAS, IDS])
        assert sorted(listed) == sorted([BIAS, IDS])
        layer5 = pull_weights(address, engine=engine, names=lambda n: ".layer.5." in n)
        assert sorted(layer5) == sorted(n for n in ref if ".layer.5." in n) and len(layer5) == 16
        for got in (listed, layer5):
            for name, arr in got.items():
                np.testing.assert_array_equal(arr, ref[name], err_msg=name)
        # into= alone selects its names; a whole tensor lands in the caller's array.
        out = sentinel((384, 384))
        only = pull_weights(address, engine=engine, into={SQUARE: out})
        assert list(only) == [SQUARE] and only[SQUARE] is out
        np.testing.assert_array_equal(out, ref[SQUARE])


def test_errors_name_the_tensor_and_no_byte_moves(
    minilm: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, ref = minilm
    with Engine("tcp") as engine, WeightServer(path, transport="tcp") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        good = sentinel((384,))
        cases: list[tuple[dict[str, object], str]] = [
            ({"names": ["nope.weight"]}, r"\['nope.weight'\] are not published"),
            ({"into": {BIAS: good, "nope.bias": sentinel((3,))}}, r"\['nope.bias'\] are not"),
            (
                {"into": {BIAS: good, ROWS: sentinel((1536, 385))}},
                rf"into\['{ROWS}'\] has dtype float32 and shape \[1536, 385\].*\[1536, 384\]",
            ),
            (
                {"into": {BIAS: good, ROWS: sentinel((1536, 384), np.float16)}},
                rf"into\['{ROWS}'\] has dtype float16",
            ),
            (
                {"into": {BIAS: good, ROWS: sentinel((256, 384))}, "shard": {ROWS: np.s_[:128]}},
                rf"tensor '{ROWS}' \(this shard of it\) is float32 of shape \[128, 384\]",
            ),
            ({"into": {BIAS: good}, "shard": {BIAS: np.s_[::-1]}}, f"'{BIAS}': axis 0 has step"),
            ({"into": {BIAS: good}, "shard": {BIAS: np.s_[384]}}, f"'{BIAS}': index 384 is out"),
            ({"into": {BIAS: good}, "shard": {BIAS: np.s_[1, 2]}}, f"tensor '{BIAS}' has 2 ind"),
            ({"names": [BIAS], "shard": {IDS: np.s_[0]}}, rf"shard names tensors \['{IDS}'\]"),
        ]
        for kwargs, message in cases:
            with pytest.raises(InvalidArgumentError, match=message):
                pull_weights(address, engine=engine, timeout=30, **kwargs)  # type: ignore[arg-type]
            assert (good == 12345).all()  # checked before any byte moved
        assert engine.stats()["read.ops"] == 0
        frozen = sentinel((384,))
        frozen.flags.writeable = False
        with pytest.raises(
            InvalidArgumentError, match=f"destination of tensor '{BIAS}'.*read-only"
        ):
            pull_weights(address, engine=engine, into={BIAS: frozen})
        # The engine and the server are still usable.
        np.testing.assert_array_equal(
            pull_weights(address, engine=engine, names=[BIAS])[BIAS], ref[BIAS]
        )


def versioned(shapes: dict[str, tuple[int, ...]], version: int) -> dict[str, np.ndarray]:
    """Tensors whose every element says the version (float32 and int64 alike)."""
    return {
        name: np.full(shape, version, dtype=np.int64 if name.startswith("i") else np.float32)
        for name, shape in shapes.items()
    }


def test_versions_never_mix_while_updates_run() -> None:
    shapes = {"a": (512, 512), "b": (1 << 18,), "i": (300, 301)}  # about 3.7 MB a version
    stop = threading.Event()
    published: list[int] = []
    errors: list[BaseException] = []
    with Engine("tcp") as engine, WeightServer(versioned(shapes, 1), transport="tcp") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"

        def updater() -> None:
            try:
                while not stop.is_set():
                    version = server.version + 1
                    assert server.update(versioned(shapes, version), timeout=30) == version
                    published.append(version)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        thread = threading.Thread(target=updater)
        thread.start()
        seen = set()
        try:
            deadline = time.monotonic() + 60
            while (len(seen) < 5 or len(published) < 10) and time.monotonic() < deadline:
                shard = {"a": np.s_[:, 100:300]} if len(seen) % 2 else None
                got = pull_weights(address, engine=engine, shard=shard, timeout=30)
                values = {name: np.unique(arr) for name, arr in got.items()}
                assert all(v.tolist() == [got.version] for v in values.values()), (
                    got.version,
                    values,
                )
                seen.add(got.version)
        finally:
            stop.set()
            thread.join(60)
        assert not errors, errors
        assert len(seen) >= 5 and len(published) >= 10, (seen, len(published))


def test_min_version_waits_for_an_update_and_times_out() -> None:
    shapes = {"w": (64, 33), "i": (5,)}
    with Engine("tcp") as engine, WeightServer(versioned(shapes, 1), transport="tcp") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        timer = threading.Timer(0.5, server.update, args=(versioned(shapes, 2),))
        start = time.monotonic()
        timer.start()
        got = pull_weights(address, engine=engine, min_version=2, timeout=30)
        timer.join()
        assert got.version == 2 and time.monotonic() - start >= 0.4
        assert (got["w"] == 2).all() and (got["i"] == 2).all()
        start = time.monotonic()
        with pytest.raises(TransferTimeoutError, match=r"version 2; version 5 \(min_version\)"):
            pull_weights(address, engine=engine, min_version=5, timeout=0.5)
        assert 0.4 < time.monotonic() - start < 10
        assert pull_weights(address, engine=engine).version == 2  # still usable


def test_update_checks_its_input_and_refresh_snapshots_the_sources(
    rng: np.random.Generator, minilm: tuple[Path, dict[str, np.ndarray]]
) -> None:
    w = rng.standard_normal((64, 33)).astype(np.float32)
    with WeightServer({"w": w}, transport="tcp") as server:
        server.start()
        address = f"127.0.0.1:{server.port}"
        with pytest.raises(InvalidArgumentError, match=r"tensors \['x'\] that are not published"):
            server.update({"x": w})
        with pytest.raises(InvalidArgumentError, match=r"tensor 'w' is published as float32"):
            server.update({"w": w.astype(np.float64)})
        assert server.version == 1
        before = w.copy()
        w += 1.0  # the trainer changed its array in place
        assert server.refresh() == 2
        got = pull_weights(address, transport="tcp")
        assert got.version == 2
        np.testing.assert_array_equal(got["w"], before + 1.0)
    path, ref = minilm
    with WeightServer(path, transport="tcp") as server:
        server.start()
        with pytest.raises(UnsupportedError, match="publishes a file"):
            server.refresh()
        new_bias = rng.standard_normal(384).astype(np.float32)
        assert server.update({BIAS: new_bias}) == 2  # the others are copied from the file
        got = pull_weights(f"127.0.0.1:{server.port}", transport="tcp", timeout=60)
    assert got.version == 2
    for name, arr in ref.items():
        np.testing.assert_array_equal(got[name], new_bias if name == BIAS else arr, err_msg=name)


def test_push_lands_whole_versions_in_the_receivers_arrays(rng: np.random.Generator) -> None:
    shapes = {"w": (256, 384), "b": (384,), "i": (7, 3)}
    dest = {n: np.zeros(s, np.int64 if n == "i" else np.float32) for n, s in shapes.items()}
    with receive_weights(dest, "127.0.0.1", 0, transport="tcp", timeout=30) as receiver:
        address = f"127.0.0.1:{receiver.port}"
        with pytest.raises(TransferTimeoutError, match=r"version 1 did not land within 0\.3 s"):
            receiver.wait(timeout=0.3)
        for version in (1, 2):
            weights = {
                "w": rng.standard_normal(shapes["w"]).astype(np.float32),
                "b": rng.standard_normal(384).astype(np.float32),
                "i": rng.integers(-(2**40), 2**40, (7, 3)),
            }
            pusher = threading.Thread(
                target=push_weights,
                args=(address, weights),
                kwargs={"version": version, "transport": "tcp", "timeout": 30},
            )
            pusher.start()
            assert receiver.wait(timeout=30) == version
            pusher.join(30)
            for name, arr in weights.items():
                np.testing.assert_array_equal(dest[name], arr, err_msg=name)
        assert receiver.version == 2 and receiver.wait(version=1, timeout=1) == 2
        # Mismatches are refused before any byte moves, naming the tensor.
        kept = {name: arr.copy() for name, arr in dest.items()}
        bad = {**weights, "w": weights["w"][:, :100].copy()}
        with pytest.raises(
            InvalidArgumentError, match=r"pushed tensor 'w' is float32 of shape \[256, 100\]"
        ):
            push_weights(address, bad, version=3, transport="tcp", timeout=30)
        with pytest.raises(InvalidArgumentError, match=r"expects \['i'\]"):
            push_weights(
                address, {"w": weights["w"], "b": weights["b"]}, version=3, transport="tcp"
            )
        for bad_version in (0, 2**63):
            with pytest.raises(InvalidArgumentError, match=r"an int in 1\.\.2\*\*63-1"):
                push_weights(address, weights, version=bad_version, transport="tcp")
        for name, arr in kept.items():
            np.testing.assert_array_equal(dest[name], arr)
        assert receiver.version == 2
        assert push_weights(address, weights, version=3, transport="tcp", timeout=30) == 3
        assert receiver.wait(timeout=1) == 3


def test_a_pull_reads_in_one_batch_and_a_push_notifies_with_its_batch(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """Every piece of a pull goes in one read_batch; a push is one write_batch whose
    notification announces the version (no READ or WRITE posted alone for host memory)."""
    batches: list[tuple[str, int, object]] = []
    read_batch, write_batch = Endpoint.post_read_batch, Endpoint.post_write_batch

    def spy_read(self: Endpoint, entries: list[object]) -> object:
        batches.append(("read", len(entries), None))
        return read_batch(self, entries)

    def spy_write(self: Endpoint, entries: list[object], *, notify: object = None) -> object:
        batches.append(("write", len(entries), notify))
        return write_batch(self, entries, notify=notify)  # type: ignore[arg-type]

    def alone(*args: object, **kwargs: object) -> None:
        pytest.fail("a READ or WRITE of host memory was posted outside a batch")

    monkeypatch.setattr(Endpoint, "post_read_batch", spy_read)
    monkeypatch.setattr(Endpoint, "post_write_batch", spy_write)
    monkeypatch.setattr(Endpoint, "post_read", alone)
    monkeypatch.setattr(Endpoint, "post_write", alone)
    table = rng.standard_normal((1024, 384)).astype(np.float32)
    with WeightServer({"t": table}, transport="tcp", timeout=30) as server:
        server.start()
        block = sentinel((1024, 96))
        got = pull_weights(
            f"127.0.0.1:{server.port}", into={"t": block}, shard={"t": np.s_[:, 96:192]},
            transport="tcp", timeout=30,
        )  # fmt: skip
    assert got["t"] is block and np.array_equal(block, table[:, 96:192])
    assert batches == [("read", 1024, None)]  # a column block: one piece per row, one batch
    dest = {"w": np.zeros((64, 384), np.float32), "b": np.zeros(384, np.float32)}
    new = {"w": table[:64].copy(), "b": table[100].copy()}
    with receive_weights(dest, "127.0.0.1", 0, transport="tcp", timeout=30) as receiver:
        assert push_weights(f"127.0.0.1:{receiver.port}", new, version=5, transport="tcp") == 5
        assert receiver.wait(timeout=30) == 5
    assert batches[1:] == [("write", 2, b"rdmaxfer.version:5")]
    for name, arr in new.items():
        np.testing.assert_array_equal(dest[name], arr, err_msg=name)

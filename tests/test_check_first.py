"""Check before you connect (TCP): an argument that is wrong on this side raises before any
connection is made, so the peer sees nothing (before, the sender connected first and the
peer's recv failed with EndpointClosedError). ``rdmaxfer pull --verify FILE`` checks FILE
before pulling."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import rdmaxfer
from rdmaxfer import Engine, InvalidArgumentError, TransferTimeoutError, cli

BAD_ARRAYS = {
    "non-contiguous": (np.arange(64, dtype=np.float32)[::2], "not C-contiguous"),
    "object dtype": (np.array([object()] * 4), "object"),
    "structured dtype": (np.zeros(4, dtype=[("a", "<f4"), ("b", "<i4")]), "dtype"),
}


@pytest.fixture
def peer() -> Iterator[tuple[Engine, str]]:
    """A listening engine that nobody may connect to."""
    with Engine("tcp") as engine:
        port = engine.listen("127.0.0.1", 0)
        yield engine, f"127.0.0.1:{port}"
    rdmaxfer.shutdown()


def assert_nobody_connected(engine: Engine) -> None:
    with pytest.raises(TransferTimeoutError):
        engine.accept(timeout=0.5)


@pytest.mark.parametrize("bad", BAD_ARRAYS, ids=list(BAD_ARRAYS))
def test_send_checks_the_array_before_connecting(peer: tuple[Engine, str], bad: str) -> None:
    engine, address = peer
    array, words = BAD_ARRAYS[bad]
    with pytest.raises(InvalidArgumentError, match=words):
        rdmaxfer.send(array, to=address, timeout=5)
    assert_nobody_connected(engine)


def test_send_with_listen_checks_the_array_before_waiting() -> None:
    with pytest.raises(InvalidArgumentError, match="not C-contiguous"):
        rdmaxfer.send(np.arange(64)[::2], listen=":0", timeout=30)


@pytest.mark.parametrize("kind", ["read-only", "non-contiguous"])
def test_recv_checks_out_before_connecting(peer: tuple[Engine, str], kind: str) -> None:
    engine, address = peer
    out = np.zeros(64, np.float32)
    if kind == "read-only":
        out.flags.writeable = False
    else:
        out = out[::2]
    with pytest.raises(InvalidArgumentError):
        rdmaxfer.recv(out, from_=address, timeout=5)
    assert_nobody_connected(engine)


@pytest.mark.parametrize("kind", ["missing", "not safetensors"])
def test_pull_verify_checks_the_file_before_pulling(
    peer: tuple[Engine, str], tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, address = peer
    path = tmp_path / "model.safetensors"
    if kind == "not safetensors":
        path.write_text("this is a text file, not weights\n")
    code = cli.main(["pull", address, "--verify", str(path), "--timeout", "5", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{str(path)!r} is not a readable safetensors file" in err, err
    assert_nobody_connected(engine)

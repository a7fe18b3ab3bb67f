"""The lean path of the blocking calls (rdmaxfer.transport.blocking): blocking send/recv/write/
read of host ndarrays make no Transfer when all goes well, and give the same bytes, dtype, shape
and errors as posting the operation and waiting on its Transfer (checked over random data, on
every host transport)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from _common import Pair
from _peers import DTYPES, make_array, same_bytes
from rdmaxfer import (
    InvalidArgumentError,
    ProtocolError,
    RemoteAccessError,
    Transfer,
    TransferTimeoutError,
    _core,
)
from rdmaxfer.memory import meta as _meta
from rdmaxfer.transport import domain

MiB = 1 << 20


@pytest.fixture
def transfers_made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The ops of every Transfer made during the test."""
    made: list[str] = []
    init = Transfer.__init__

    def counting(self: Transfer[Any], endpoint: Any, op: str, *args: Any, **kwargs: Any) -> None:
        made.append(op)
        init(self, endpoint, op, *args, **kwargs)

    monkeypatch.setattr(Transfer, "__init__", counting)
    yield made


def _recv_in_thread(pair: Pair, out: np.ndarray | None = None) -> Callable[[], np.ndarray]:
    """Start a blocking ``pair.b.recv(out)`` in a thread; the returned call joins it."""
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(pair.b.recv(out, timeout=30)))
    thread.start()

    def join() -> np.ndarray:
        thread.join(60)
        assert not thread.is_alive() and len(got) == 1
        result: np.ndarray = got[0]
        return result

    return join


def test_blocking_calls_on_host_arrays_make_no_transfer(
    pair: Pair, transfers_made: list[str], seed: int
) -> None:
    target = np.zeros(3 * MiB, np.uint8)
    region = pair.server.register(target)
    for nbytes in (8, 64 << 10, 3 * MiB):
        sent = make_array(seed + nbytes, nbytes)
        pair.a.write(sent, region.descriptor().pack(), timeout=30)
        back = np.zeros(nbytes, np.uint8)
        pair.a.read(back, region.descriptor(), timeout=30)
        assert same_bytes(back, sent) and same_bytes(target[:nbytes], sent)
        join = _recv_in_thread(pair)
        pair.a.send(sent, timeout=30)
        assert same_bytes(join(), sent)
        out = np.zeros(nbytes, np.uint8)
        join = _recv_in_thread(pair, out)
        pair.a.send(sent, timeout=30)
        assert join() is out and same_bytes(out, sent)
    assert transfers_made == []
    assert pair.a.inflight == 0 and pair.b.inflight == 0


@pytest.mark.parametrize("name", [*DTYPES, "datetime64[ns]", "complex128", "bool"])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4, 5), (1000, 33)])
def test_lean_and_posted_paths_give_the_same_arrays(
    pair: Pair, name: str, shape: tuple[int, ...], seed: int
) -> None:
    dtype = DTYPES.get(name) or np.dtype(name)
    sent = make_array(seed, shape, dtype)
    posted = pair.b.post_recv()
    pair.a.send(sent, timeout=30)  # lean send
    by_transfer = posted.wait(30)
    transfer = pair.a.post_send(sent)
    lean = pair.b.recv(timeout=30)  # lean recv, allocating
    transfer.wait(30)
    out = np.zeros(shape, dtype)
    transfer = pair.a.post_send(sent)
    into = pair.b.recv(out, timeout=30)  # lean recv into out
    transfer.wait(30)
    for got in (by_transfer, lean, into):
        assert got.dtype == dtype and got.dtype.type is dtype.type and got.shape == shape
        assert same_bytes(got, sent)
    assert into is out


def test_lean_one_sided_matches_posted_at_random_ranges(
    pair: Pair, rng: np.random.Generator, seed: int
) -> None:
    lean_target = np.zeros(MiB, np.uint8)
    posted_target = np.zeros(MiB, np.uint8)
    lean_region = pair.server.register(lean_target)
    posted_region = pair.server.register(posted_target)
    source = make_array(seed, MiB)
    for _ in range(20):
        offset = int(rng.integers(0, MiB))
        nbytes = int(rng.integers(0, MiB - offset + 1))
        remote_offset = int(rng.integers(0, MiB - nbytes + 1))
        kw = {"offset": offset, "nbytes": nbytes, "remote_offset": remote_offset}
        pair.a.write(source, lean_region.descriptor(), timeout=30, **kw)
        pair.a.post_write(source, posted_region.descriptor(), **kw).wait(30)
        lean_back = np.zeros(MiB, np.uint8)
        posted_back = np.zeros(MiB, np.uint8)
        pair.a.read(lean_back, lean_region.descriptor(), timeout=30, **kw)
        pair.a.post_read(posted_back, posted_region.descriptor(), **kw).wait(30)
        assert same_bytes(lean_back, posted_back)
        assert same_bytes(lean_target, posted_target)
        got = lean_target[remote_offset : remote_offset + nbytes]
        assert same_bytes(got, source[offset : offset + nbytes])


def _raised(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def test_lean_and_posted_paths_raise_the_same_errors(pair: Pair, seed: int) -> None:
    a = pair.a
    target = np.zeros(4096, np.uint8)
    region = pair.server.register(target, access="r")  # peers may read it, not write it
    desc = region.descriptor()
    src = make_array(seed, 4096)
    read_only = src.copy()
    read_only.flags.writeable = False
    grid = make_array(seed, (64, 64), np.float32)
    cases: list[tuple[Callable[[], object], Callable[[], object]]] = [
        (lambda: a.write(grid[:, ::2], desc), lambda: a.post_write(grid[:, ::2], desc).wait()),
        (lambda: a.write(src, desc, offset=5000), lambda: a.post_write(src, desc, offset=5000)),
        (lambda: a.write(src, desc, nbytes=5000), lambda: a.post_write(src, desc, nbytes=5000)),
        (
            lambda: a.write(src, desc, remote_offset=-1),
            lambda: a.post_write(src, desc, remote_offset=-1),
        ),
        (lambda: a.write(src, b"short"), lambda: a.post_write(src, b"short")),
        (lambda: a.write(src, None), lambda: a.post_write(src, None)),  # type: ignore[arg-type]
        (lambda: a.read(read_only, desc), lambda: a.post_read(read_only, desc)),
        (lambda: a.write(src, desc, timeout=10), lambda: a.post_write(src, desc).wait(10)),
        (lambda: a.send(grid[:, ::2]), lambda: a.post_send(grid[:, ::2])),
        (lambda: a.send(np.empty(3, object)), lambda: a.post_send(np.empty(3, object))),
        (lambda: a.recv(read_only, timeout=1), lambda: a.post_recv(read_only).wait(1)),
        (lambda: a.recv(grid[:, ::2], timeout=1), lambda: a.post_recv(grid[:, ::2]).wait(1)),
        (lambda: a.recv(timeout=0.3), lambda: a.post_recv().wait(0.3)),
        (lambda: a.recv(timeout=5, deadline=0.3), lambda: a.post_recv().wait(5, deadline=0.3)),
        (lambda: a.recv(timeout=-1), lambda: a.post_recv().wait(-1)),
    ]
    for lean, posted in cases:
        lean_error, posted_error = _raised(lean), _raised(posted)
        assert lean_error == posted_error
        assert issubclass(lean_error[0], (InvalidArgumentError, ProtocolError, Exception))
    assert _raised(cases[7][0])[0].__name__ == "RemoteAccessError"
    assert _raised(cases[12][0])[0] is TransferTimeoutError
    # the endpoint is still usable after all of that (none of it aborted it)
    ok = pair.server.register(np.zeros(4096, np.uint8))
    a.write(src, ok.descriptor(), timeout=30)
    assert same_bytes(ok.numpy(), src)


@pytest.mark.parametrize("nbytes", [1000, 3 * MiB], ids=["eager", "rendezvous"])
def test_lean_recv_mismatch_rejects_as_the_posted_one(pair: Pair, nbytes: int, seed: int) -> None:
    sent = make_array(seed, nbytes // 4, np.float32)
    errors = []
    for lean in (True, False):
        out = make_array(seed + 1, (nbytes // 8, 2), np.float32)
        before = out.copy()
        transfer = pair.a.post_send(sent)
        if lean:
            errors.append(_raised(lambda: pair.b.recv(out=out, timeout=30)))  # noqa: B023
        else:
            errors.append(_raised(lambda: pair.b.post_recv(out=out).wait(30)))  # noqa: B023
        assert same_bytes(out, before), "out must be untouched"
        with pytest.raises(ProtocolError, match=r"receiver .*rejected the message"):
            transfer.wait(30)
    assert errors[0] == errors[1] and errors[0][0] is InvalidArgumentError
    # then a matching message goes through the lean path
    transfer = pair.a.post_send(sent)
    assert same_bytes(pair.b.recv(timeout=30), sent)
    transfer.wait(30)


def test_lean_recv_hands_a_checksummed_message_to_the_general_step(
    pair: Pair, transfers_made: list[str], seed: int
) -> None:
    sent = make_array(seed, (300, 7), np.float64)
    transfer = pair.a.post_send(sent, checksum=True)
    got = pair.b.recv(timeout=30)
    transfer.wait(30)
    assert same_bytes(got, sent)
    assert transfers_made == ["send", "recv"]  # the recv verified the checksum as a Transfer


def test_address_of_is_the_array_interface_address(seed: int) -> None:
    base = make_array(seed, 4096)
    read_only = base.copy()
    read_only.flags.writeable = False
    arrays = [base, base[17:], base[4096:], base.view(np.float32)[3:9], read_only]
    arrays += [make_array(seed, (5, 6), dtype) for dtype in DTYPES.values()]
    arrays += [np.arange(10).astype("datetime64[ns]")]  # no buffer with a format, yet an address
    for arr in arrays:
        expected = arr.__array_interface__["data"][0]
        assert _core.address_of(arr) == expected
        assert domain._addr(arr) == expected
    with pytest.raises(ValueError, match="not contiguous"):
        _core.address_of(base[::2])


def test_post_wait_bindings_hand_back_the_request_only_when_not_done(pair: Pair, seed: int) -> None:
    core = pair.a.core
    nbytes = 64 << 10
    src = make_array(seed, nbytes)
    local = pair.client.register(src).core
    target = np.zeros(nbytes, np.uint8)
    desc = _core.Descriptor.unpack(pair.server.register(target).descriptor().pack())
    slot: list[_core.Request | None] = [None]
    # completed within the wait: True, and no Request comes back
    assert core.post_write_wait(local, 0, desc, 0, nbytes, 0, 0, 30.0, slot) is True
    assert slot == [None] and same_bytes(target, src)
    back = np.zeros(nbytes, np.uint8)
    dest = pair.client.register(back).core
    assert core.post_read_wait(dest, 0, desc, 0, nbytes, 0, 0, 30.0, slot) is True
    assert slot == [None] and same_bytes(back, src)
    join = _recv_in_thread(pair)
    record = _meta.encode(src.dtype, src.shape)
    assert core.post_send_wait(local, 0, nbytes, record, 0, 0, 30.0, slot) is True
    assert slot == [None] and same_bytes(join(), src)
    # no wait (0 s): posted, handed back pending or done, and it completes
    again = make_array(seed + 1, nbytes)
    src[:] = again
    assert core.post_write_wait(local, 0, desc, 0, nbytes, 0, 0, 0.0, slot) is False
    request = slot[0]
    assert isinstance(request, _core.Request) and request.wait(30) and not request.failed()
    assert same_bytes(target, again)
    # refused by the peer: handed back failed, with the peer's reason
    read_only = _core.Descriptor.unpack(
        pair.server.register(np.zeros(nbytes, np.uint8), access="r").descriptor().pack()
    )
    slot = [None]
    assert core.post_write_wait(local, 0, read_only, 0, nbytes, 0, 0, 30.0, slot) is False
    failed = slot[0]
    assert isinstance(failed, _core.Request) and failed.done() and failed.failed()
    with pytest.raises(RemoteAccessError, match="refused access"):
        failed.check()
    # a bad slot or range raises before anything is posted, slot untouched
    with pytest.raises(InvalidArgumentError, match="slot must be a list of one item"):
        core.post_write_wait(local, 0, desc, 0, nbytes, 0, 0, 30.0, [])
    slot = [None]
    with pytest.raises(InvalidArgumentError):
        core.post_write_wait(local, 1, desc, 0, nbytes, 0, 0, 30.0, slot)
    assert slot == [None]

"""load_weights: safetensors from local disk into host arrays (every dtype), multi-file
checkpoints, into= and shard= checks, O_DIRECT refused, truncated and corrupt files."""

from __future__ import annotations

import errno
import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from _st_files import random_tensors, write, write_sharded
from rdmaxfer import load_weights
from rdmaxfer.errors import CorruptFileError, InvalidArgumentError


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_every_dtype_lands_bit_exact(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = random_tensors(rng)
    got = load_weights(write(tmp_path / "m.safetensors", tensors))
    assert sorted(got) == sorted(tensors)
    for name, arr in tensors.items():
        assert same(got[name], arr), name
    (f,) = got.files
    assert f.engine == "io_uring" or f.engine.startswith("pread (")
    assert f.io in ("direct", "buffered") and f.align >= 4096
    assert got.nbytes == sum(a.nbytes for a in tensors.values())


def test_matches_the_safetensors_library(tmp_path: Path, rng: np.random.Generator) -> None:
    from safetensors.numpy import save_file

    tensors = {f"x{i}": rng.standard_normal((64, 7 + i)).astype(np.float16) for i in range(30)}
    path = tmp_path / "lib.safetensors"
    save_file(tensors, str(path))
    ref = load_file(str(path))
    got = load_weights(path, chunk_bytes=4096, depth=3)  # many reads, few in flight
    assert all(same(got[k], ref[k]) for k in ref)


def test_names_into_and_shards(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = random_tensors(rng)
    path = write(tmp_path / "m.safetensors", tensors)
    dest = np.zeros((20, 33), np.float32)
    got = load_weights(path, into={"w1": dest}, shard={"w1": np.s_[0:20]})
    assert got["w1"] is dest and list(got) == ["w1"]
    assert same(dest, tensors["w1"][0:20])
    cols = load_weights(path, names=["w4", "t_bf16"], shard={"w4": np.s_[:, 5:9]})
    assert sorted(cols) == ["t_bf16", "w4"]
    assert same(cols["w4"], np.ascontiguousarray(tensors["w4"][:, 5:9]))
    assert same(cols["t_bf16"], tensors["t_bf16"])
    picked = load_weights(path, names=lambda n: n.startswith("t_u"))
    assert sorted(picked) == ["t_u16", "t_u32", "t_u64", "t_u8"]


@pytest.mark.parametrize(
    ("into", "message"),
    [
        ({"w1": np.zeros((20, 33), np.float64)}, r"into\['w1'\] has dtype float64"),
        ({"w1": np.zeros((19, 33), np.float32)}, r"into\['w1'\] has dtype float32 and shape"),
        ({"nope": np.zeros(3, np.float32)}, r"\['nope'\] are not published"),
    ],
)
def test_into_is_checked_before_any_byte_moves(
    tmp_path: Path, rng: np.random.Generator, into: dict[str, np.ndarray], message: str
) -> None:
    path = write(tmp_path / "m.safetensors", random_tensors(rng))
    good = np.zeros((17, 33), np.float32)
    with pytest.raises(InvalidArgumentError, match=message):
        load_weights(path, into={"w0": good, **into})
    assert not good.any()


def test_a_read_only_destination_is_refused(tmp_path: Path, rng: np.random.Generator) -> None:
    path = write(tmp_path / "m.safetensors", random_tensors(rng))
    dest = np.zeros((17, 33), np.float32)
    dest.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="w0"):
        load_weights(path, into={"w0": dest})


@pytest.mark.parametrize("given", ["index", "folder"])
def test_a_sharded_checkpoint_loads_as_one(
    tmp_path: Path, rng: np.random.Generator, given: str
) -> None:
    tensors = random_tensors(rng, count=9)
    index = write_sharded(tmp_path, tensors, files=3)
    got = load_weights(index if given == "index" else tmp_path)
    assert sorted(got) == sorted(tensors)
    assert all(same(got[k], v) for k, v in tensors.items())
    assert [Path(f.path).name for f in got.files] == [
        f"model-{k:05d}-of-00003.safetensors" for k in (1, 2, 3)
    ]
    one = load_weights(index, names=["w2"])
    assert [Path(f.path).name for f in one.files] == ["model-00003-of-00003.safetensors"]


def test_an_index_naming_the_wrong_file_is_refused(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    index = write_sharded(tmp_path, random_tensors(rng), files=2)
    doc = json.loads(index.read_text())
    doc["weight_map"]["t_f64"] = "model-00002-of-00002.safetensors"  # it is in file 1
    index.write_text(json.dumps(doc))
    with pytest.raises(InvalidArgumentError, match="maps tensor 't_f64'"):
        load_weights(index)


def test_buffered_reads_where_o_direct_is_refused(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = random_tensors(rng)
    path = write(tmp_path / "m.safetensors", tensors)
    real_open = os.open

    def refusing(p: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(p))
        return real_open(p, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    got = load_weights(path)
    assert got.io == "buffered" and "refuses O_DIRECT" in got.files[0].why
    assert all(same(got[k], v) for k, v in tensors.items())


def test_tmpfs(rng: np.random.Generator) -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    tensors = random_tensors(rng)
    path = write(Path("/dev/shm") / f"rdmaxfer-load-{os.getpid()}.safetensors", tensors)
    try:
        got = load_weights(path)
        assert all(same(got[k], v) for k, v in tensors.items())
        assert (got.io == "direct") == (got.files[0].why == "")
        assert load_weights(path, direct=False).files[0].why == "direct=False"
    finally:
        path.unlink()


def test_a_truncated_file_names_the_tensor_and_offset(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    path = write(tmp_path / "m.safetensors", random_tensors(rng))
    size = path.stat().st_size
    os.truncate(path, size - 100)
    with pytest.raises(CorruptFileError, match="tensor 'w5' at offset") as info:
        load_weights(path)
    assert info.value.path == str(path) and info.value.tensor == "w5"
    assert str(info.value.offset) in str(info.value)
    assert f"past the end of the file ({size - 100} bytes)" in str(info.value)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda h: h.replace(b'"F32"', b'"F33"', 1), "tensor 't_f32' at offset 8: dtype 'F33'"),
        (lambda h: b"{" + h[1:].replace(b"{", b"[", 1), "the header at offset 8: the header is"),
        (lambda h: h.replace(b'"shape": [17, 33]', b'"shape": [17, 34]'), "tensor 'w0' at off"),
    ],
)
def test_a_corrupt_header_is_refused(
    tmp_path: Path, rng: np.random.Generator, damage: Any, message: str
) -> None:
    path = write(tmp_path / "m.safetensors", random_tensors(rng))
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = damage(blob[8 : 8 + n])
    header += b" " * (n - len(header))
    path.write_bytes(blob[:8] + header[:n] + blob[8 + n :])
    with pytest.raises(CorruptFileError, match=message):
        load_weights(path)


def test_a_header_size_past_the_end(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(CorruptFileError, match="the header at offset 8: a header of 1048576"):
        load_weights(path)


def test_bad_options(tmp_path: Path, rng: np.random.Generator) -> None:
    path = write(tmp_path / "m.safetensors", random_tensors(rng))
    with pytest.raises(InvalidArgumentError, match="depth=0"):
        load_weights(path, depth=0)
    with pytest.raises(InvalidArgumentError, match=r"neither model\.safetensors"):
        load_weights(tmp_path)
    with pytest.raises(InvalidArgumentError, match="could not be read"):
        load_weights(tmp_path / "missing.safetensors")


def test_serving_a_file_reads_it_with_the_load_path(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rdmaxfer import pull_weights
    from rdmaxfer.weights import WeightServer
    from rdmaxfer.weights import snapshot as snapshot_module

    tensors = random_tensors(rng)
    path = write(tmp_path / "m.safetensors", tensors)
    original = path.read_bytes()
    seen: list[str] = []
    read_whole = snapshot_module.read_whole

    def writer_not_done(p: Path, opened: Any, *args: Any) -> int:
        seen.append(opened.io)
        if len(seen) > 1:
            return read_whole(p, opened, *args)
        os.truncate(p, len(original) - 40)  # the first read meets a file being written
        try:
            return read_whole(p, opened, *args)
        finally:
            p.write_bytes(original)  # the writer finishes

    monkeypatch.setattr(snapshot_module, "read_whole", writer_not_done)
    with WeightServer(path, transport="tcp", timeout=30) as server:
        server.start()
        assert len(seen) == 2 and set(seen) <= {"direct", "buffered"}
        path.write_bytes(b"\0" * len(original))  # rewritten after publishing: never served
        got = pull_weights(f"127.0.0.1:{server.port}", transport="tcp", timeout=30)
    assert all(same(got[k], v) for k, v in tensors.items())


def test_a_failed_read_names_the_offset_and_errno(tmp_path: Path, rng: np.random.Generator) -> None:
    """Every read fails (a write-only descriptor) while others are in flight: the error names
    the file, the offset and errno, and no read is left in the kernel."""
    from rdmaxfer import _core
    from rdmaxfer.errors import TransportError
    from rdmaxfer.weights.snapshot import owned_buffer

    path = write(tmp_path / "m.safetensors", random_tensors(rng, count=40))
    size = path.stat().st_size
    length = -(-size // 4096) * 4096
    out = owned_buffer(length, 4096)
    fd = os.open(path, os.O_WRONLY)
    try:
        with pytest.raises(TransportError, match=r"read of '.*m\.safetensors' at offset \d+: "):
            _core.read_file_ranges(
                fd, str(path), size, [(0, length, out.ctypes.data)], [], chunk=4096, depth=8
            )
    finally:
        os.close(fd)


@pytest.mark.parametrize("prefault", [True, False])
def test_direct_reads_into_fresh_pages_faulted_ahead(tmp_path: Path, prefault: bool) -> None:
    """Many more direct reads than are in flight into new, untouched memory: with the pages
    faulted in ahead on a second thread (MADV_POPULATE_WRITE) or by the reads themselves, every
    byte lands."""
    import mmap

    from rdmaxfer import _core

    data = np.random.default_rng(31).integers(0, 256, 6 << 20, dtype=np.uint8)
    path = tmp_path / "raw.bin"
    path.write_bytes(data.tobytes())
    pages = mmap.mmap(-1, data.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    out = np.frombuffer(pages, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        stats = _core.read_file_ranges(
            fd, str(path), data.nbytes, [(0, data.nbytes, out.ctypes.data)], [],
            chunk=64 << 10, depth=4, prefault=prefault,
        )  # fmt: skip
    finally:
        os.close(fd)
    assert stats["reads"] == data.nbytes // (64 << 10) and stats["bytes_read"] == data.nbytes
    assert out.tobytes() == data.tobytes()
    del out
    pages.close()


@pytest.mark.parametrize("when", ["before the reads", "during the reads"])
def test_a_file_changed_while_it_is_loaded_is_refused(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A writer replaces the file after its header was read (a new inode), or appends to it while
    it is read: CorruptFileError naming the file, and nothing returned."""
    from rdmaxfer.weights import loading

    tensors = random_tensors(rng)
    path = write(tmp_path / "m.safetensors", tensors)
    if when == "before the reads":
        real_open = loading.open_checkpoint

        def then_replaced(p: Any) -> Any:
            files = real_open(p)
            write(tmp_path / "next.safetensors", random_tensors(rng)).replace(path)
            return files

        monkeypatch.setattr(loading, "open_checkpoint", then_replaced)
    else:
        real_read = loading._core.read_file_ranges

        def appended_meanwhile(*args: Any, **kwargs: Any) -> Any:
            with open(path, "ab") as f:
                f.write(b"\0" * 4096)
            return real_read(*args, **kwargs)

        monkeypatch.setattr(loading._core, "read_file_ranges", appended_meanwhile)
    with pytest.raises(CorruptFileError, match="changed on disk since its header was read") as e:
        load_weights(path)
    assert e.value.path == str(path) and e.value.offset == 0

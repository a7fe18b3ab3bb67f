"""Interop with an independent verbs peer: a pyverbs program (Debian's python3-pyverbs) that
speaks rdmaxfer's documented bootstrap and endpoint record with ``struct``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from rdmaxfer import _core

from .rdma_helpers import RW, WAIT_S, addrs, make_engine, random_bytes, region_array, wait_ok

pytestmark = pytest.mark.rdma

PEER = os.path.join(os.path.dirname(__file__), "pyverbs_peer.py")


def pyverbs_command() -> tuple[list[str], dict[str, str]]:
    """/usr/bin/python3 when it has pyverbs, else this interpreter with RDMAXFER_PYVERBS_PATH."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    system = shutil.which("python3", path="/usr/bin")
    probe = [system, "-c", "import pyverbs"] if system else None
    if probe and subprocess.run(probe, env=env, capture_output=True, timeout=60).returncode == 0:
        return [system, PEER], env  # type: ignore[list-item]
    path = os.environ.get("RDMAXFER_PYVERBS_PATH")
    if not path:
        pytest.skip("pyverbs not found (install python3-pyverbs; the rxe VM sets it up)")
    env["PYTHONPATH"] = path
    return [sys.executable, PEER], env


class Peer:
    def __init__(self, args: list[str]) -> None:
        cmd, env = pyverbs_command()
        self.proc = subprocess.Popen(
            [*cmd, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def read(self) -> dict[str, object]:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(WAIT_S)
        if not box or not box[0]:
            self.proc.kill()
            raise AssertionError(f"pyverbs peer said nothing; stderr: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        msg = json.loads(box[0])
        assert msg.get("step") != "error", msg
        return msg  # type: ignore[no-any-return]

    def write(self, **fields: object) -> None:
        self.proc.stdin.write(json.dumps(fields) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def close(self) -> None:
        try:
            self.write(step="bye")
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def test_pyverbs_peer_interop(rng: np.random.Generator) -> None:
    length = 64 * 1024 + 3
    gid_index = os.environ.get("RDMAXFER_GID_INDEX", "1")
    engine = make_engine(1)
    try:
        port = engine.listen(addrs()[1], 0)
        dst = engine.alloc_pinned(length, RW)
        region_array(dst)[:] = 0x55
        desc = dst.descriptor()
        peer = Peer(
            [
                "rxe0",
                gid_index,
                addrs()[1],
                str(port),
                str(desc.addr),
                str(desc.key),
                str(length),
                "1234",
            ]
        )
        try:
            ep = engine.accept(WAIT_S)
            # Negotiated from the endpoint records: our READ depth is the peer's responder
            # resources (1), the READs we serve its initiator depth (2); MTU the smaller one.
            attrs = ep.attributes()
            assert attrs["max_rd_atomic"] == 1 and attrs["max_dest_rd_atomic"] == 2, attrs
            assert attrs["path_mtu"] == 4096, attrs
            assert "max_rd_atomic 1, max_dest_rd_atomic 2" in ep.describe()
            # 1. pyverbs RDMA-WROTE into our buffer.
            wrote = peer.read()
            assert wrote["step"] == "wrote"
            assert region_array(dst).tobytes() == bytes.fromhex(str(wrote["hex"]))

            # 2. We RDMA-WRITE into pyverbs' MR: a descriptor built from its address and rkey.
            packed = bytearray(desc.pack())
            packed[8:16] = int(wrote["mr_addr"]).to_bytes(8, "little")  # type: ignore[call-overload]
            packed[16:24] = length.to_bytes(8, "little")
            packed[24:28] = int(wrote["mr_rkey"]).to_bytes(4, "little")  # type: ignore[call-overload]
            # ... of the peer's engine (its Hello's id): an endpoint takes only its peer's.
            packed[32:40] = int(wrote["engine_id"]).to_bytes(8, "little")  # type: ignore[call-overload]
            theirs = _core.Descriptor.unpack(bytes(packed))
            src = engine.alloc_pinned(length, 0)
            data = random_bytes(rng, length)
            region_array(src)[:] = data
            wait_ok(ep.post_write(src, 0, theirs, 0, length))
            peer.write(hex=data.tobytes().hex())
            assert peer.read() == {"step": "checked", "match": True}

            # 3. A two-sided message: RTS, pyverbs' CTS, our WRITEs ending in WRITE_WITH_IMM.
            message = random_bytes(rng, length)
            region_array(src)[:] = message
            send = ep.post_send(src, 0, length, b"interop", 0, 0)
            got = peer.read()
            wait_ok(send)
            assert got["meta"] == "interop"
            assert got["imm"] == got["msg_low32"], "the immediate must carry the message id"
            assert bytes.fromhex(str(got["hex"])) == message.tobytes()
        finally:
            peer.close()
    finally:
        engine.close()

"""Engines, endpoints and one-sided WRITE/READ into registered memory, both sides.

Node A owns the memory and lets node B write and read it; node B learns where it is from the
region's ``Descriptor`` (40 bytes: address, length, key...), which A sends it as a message.

Both sides on this machine:  python examples/one_sided.py
On two machines (the same RDMAXFER_SECRET set on both):
    python examples/one_sided.py --role node_a --host 0.0.0.0   # on node A
    python examples/one_sided.py --role node_b --host NODE_A    # on node B
"""

import numpy as np

import _two_sides as two_sides
import rdmaxfer as rdma


def node_a(host: str, port: int) -> None:
    with rdma.Engine() as engine:  # "auto": shm for a peer of this host, else rdma or tcp
        engine.listen(host, port)
        ep = engine.accept(timeout=60)
        memory = np.zeros(1 << 20, np.uint8)
        region = engine.register(memory, access="rw")  # peers may READ and WRITE it
        ep.send(np.frombuffer(region.descriptor().pack(), np.uint8), timeout=30)
        done = ep.recv(timeout=60)  # node B's checksum, once it is finished
        assert int(done[0]) == int(memory.sum(dtype=np.uint64))
        print(f"node B wrote {memory.nbytes} bytes, checksum {int(done[0])}")


def node_b(host: str, port: int) -> None:
    with rdma.Engine() as engine:
        ep = engine.connect(f"{host}:{port}", timeout=30)
        remote = rdma.Descriptor.unpack(ep.recv(timeout=30).tobytes())
        data = np.random.default_rng(0).integers(0, 256, remote.length, dtype=np.uint8)
        ep.write(data, remote, timeout=30)  # one-sided WRITE: node A's CPU takes no part
        back = np.empty_like(data)
        ep.read(back, remote, timeout=30)  # one-sided READ
        assert np.array_equal(back, data)
        transfer = ep.post_send(np.array([data.sum(dtype=np.uint64)]))  # posted: returns at once
        transfer.wait(30)  # or, in a coroutine: await ep.asend(...)


if __name__ == "__main__":
    two_sides.main("one-sided WRITE/READ, both sides", node_a, node_b)

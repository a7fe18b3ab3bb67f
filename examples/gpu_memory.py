"""GPU memory in the same calls as host memory: a message received straight into GPU memory,
sent again from there, and a one-sided WRITE and READ between GPU memory and a peer's host
memory. CuPy arrays, PyTorch CUDA tensors and anything with ``__cuda_array_interface__`` or a
CUDA ``__dlpack__`` go where the device ``rdmaxfer.Buffer`` goes here.

Needs a CUDA GPU (without one it exits saying why).

Both sides on this machine:  python examples/gpu_memory.py
On two machines (the same RDMAXFER_SECRET set on both):
    python examples/gpu_memory.py --role host_side --host 0.0.0.0   # on node A (host memory)
    python examples/gpu_memory.py --role gpu_side --host NODE_A    # on node B (a GPU)
"""

import numpy as np

import _two_sides as two_sides
import rdmaxfer as rdma

N = 1 << 22  # float32 values: 16 MiB


def data() -> np.ndarray:
    return np.random.default_rng(3).standard_normal(N, dtype=np.float32)


def host_side(host: str, port: int) -> None:
    with rdma.Engine() as engine:
        engine.listen(host, port)
        ep = engine.accept(timeout=60)
        ep.send(data(), timeout=60)  # an ordinary message; the peer receives it into its GPU
        echo = ep.recv(timeout=60)  # sent back from GPU memory: any receiver gets a message
        assert np.array_equal(echo, data())
        memory = np.zeros(N, np.float32)
        region = engine.register(memory, access="rw")
        ep.send(np.frombuffer(region.descriptor().pack(), np.uint8), timeout=30)
        ep.recv(timeout=60)  # the GPU side is done
        assert np.array_equal(memory, data())
        print(f"GPU round trip of {memory.nbytes} bytes: exact")


def gpu_side(host: str, port: int) -> None:
    with rdma.Engine() as engine:
        ep = engine.connect(f"{host}:{port}", timeout=30)
        x = ep.recv(device="cuda:0", timeout=60)  # a new CuPy array (a device Buffer without)
        ep.send(x, timeout=60)  # from GPU memory
        remote = rdma.Descriptor.unpack(ep.recv(timeout=30).tobytes())
        ep.write(x, remote, timeout=60)  # one-sided WRITE from GPU memory
        back = rdma.Buffer.empty((N,), "float32", device="cuda:0")  # cuMemAlloc
        ep.read(back, remote, timeout=60)  # one-sided READ into GPU memory
        assert np.array_equal(back.copy_to_host(), data())
        ep.send(np.zeros(1, np.uint8), timeout=30)


if __name__ == "__main__":
    if not rdma.cuda.available():
        raise SystemExit(f"no CUDA GPU here: {rdma.cuda.unavailable_reason()}")
    two_sides.main("GPU memory through send/recv/write/read", host_side, gpu_side)

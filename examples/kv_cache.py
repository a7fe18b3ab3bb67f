"""KV-cache pages from a prefill node into a decode node's paged cache: one ``write_batch``
of scattered pages, and a notification the decode node gets only once every page is in its
memory.

Both sides on this machine:  python examples/kv_cache.py
On two machines (the same RDMAXFER_SECRET set on both):
    python examples/kv_cache.py --role decode --host 0.0.0.0     # on the decode node
    python examples/kv_cache.py --role prefill --host DECODE     # on the prefill node
"""

import numpy as np

import _two_sides as two_sides
import rdmaxfer as rdma

LAYERS, PAGES, PAGE = 4, 64, 16 * 1024  # this request's K/V pages: 4 x 2 x 64 of 16 KiB
POOL = 4096  # page slots in the decode node's cache (64 MiB)


def prefill_output() -> np.ndarray:
    """The prefill node's pages (random here, so the decode node can check every byte)."""
    shape = (LAYERS, 2, PAGES, PAGE)
    return np.random.default_rng(42).integers(0, 256, shape, dtype=np.uint8)


def decode(host: str, port: int) -> None:
    with rdma.Engine() as engine:
        engine.listen(host, port)
        ep = engine.accept(timeout=60)
        cache = np.zeros((POOL, PAGE), np.uint8)  # the paged KV pool
        region = engine.register(cache, access="w")  # peers may WRITE into it
        slots = np.random.default_rng(7).permutation(POOL)[: LAYERS * 2 * PAGES]  # free slots
        ep.send(np.frombuffer(region.descriptor().pack(), np.uint8), timeout=30)
        ep.send(slots, timeout=30)  # where each of the prefill node's pages goes
        _, payload = engine.wait_notification(timeout=60)  # only once every page landed
        pages = prefill_output().reshape(-1, PAGE)
        assert np.array_equal(cache[slots], pages)
        print(f"decode node: {payload!r}, all {len(slots)} pages in place")


def prefill(host: str, port: int) -> None:
    with rdma.Engine() as engine:
        ep = engine.connect(f"{host}:{port}", timeout=30)
        cache = rdma.Descriptor.unpack(ep.recv(timeout=30).tobytes())  # the decode node's pool
        slots = ep.recv(timeout=30)  # its free page slot for each of our pages
        kv = prefill_output()
        region = engine.register(kv, access="none")  # local source only
        entries = [((region, i * PAGE, PAGE), cache, int(s) * PAGE) for i, s in enumerate(slots)]
        result = ep.write_batch(entries, notify=b"request 42", timeout=30)  # one call
        result.check()  # raises the first failed entry's error


if __name__ == "__main__":
    two_sides.main("a KV-cache write_batch with a notification", decode, prefill)

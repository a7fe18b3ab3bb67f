"""Memory of the CUDA VMM API made through the stand-in driver's entry points (tests of CUDA
IPC over shm: tests/test_shm_cuda_ipc.py and its peer process, tests/_ipc_peer.py)."""

from __future__ import annotations

import ctypes
import os


def standin_library() -> ctypes.CDLL | None:
    """The stand-in driver loaded by this process, or None on a real driver."""
    path = os.environ.get("RDMAXFER_CUDA_LIBRARY", "")
    return ctypes.CDLL(path) if "cuda_standin" in path else None


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int), ("flags", ctypes.c_int)]


class VmmArray:
    """``nbytes`` of GPU 0 memory from the VMM API (cuMemCreate, cuMemAddressReserve,
    cuMemMap, cuMemSetAccess), as PyTorch's expandable segments allocate, through the stand-in
    driver; seen through ``__cuda_array_interface__``. cuIpcGetMemHandle refuses it."""

    def __init__(self, lib: ctypes.CDLL, nbytes: int) -> None:
        c = ctypes
        handle, ptr = c.c_ulonglong(), c.c_ulonglong()
        prop = (c.c_char * 64)()  # CUmemAllocationProp: the stand-in does not read it
        assert lib.cuMemCreate(c.byref(handle), c.c_size_t(nbytes), prop, c.c_ulonglong(0)) == 0
        assert lib.cuMemAddressReserve(c.byref(ptr), c.c_size_t(nbytes), c.c_size_t(0),
                                       c.c_ulonglong(0), c.c_ulonglong(0)) == 0  # fmt: skip
        assert lib.cuMemMap(ptr, c.c_size_t(nbytes), c.c_size_t(0), handle, c.c_ulonglong(0)) == 0
        desc = _AccessDesc(1, 0, 3)  # a device location, GPU 0, read-write
        assert lib.cuMemSetAccess(ptr, c.c_size_t(nbytes), c.byref(desc), c.c_size_t(1)) == 0
        assert lib.cuMemRelease(handle) == 0  # the mapping holds the memory
        self.ptr, self.nbytes = int(ptr.value), nbytes

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}

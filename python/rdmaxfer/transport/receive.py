"""The receive step of a two-sided message, once for every memory kind.

When a message's header has arrived, :func:`recv_step` reads its dtype and shape, checks them
against ``out`` (rejecting the message, with ``out`` untouched, on a mismatch) or allocates the
array (host memory, or GPU memory on the asked GPU), then places the bytes: into host memory
through a registration of the engine, into GPU memory straight into its GPUDirect registration
when it has one, else through the engine's staging pipeline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .. import _core
from ..errors import ChecksumError, InvalidArgumentError, ProtocolError, RdmaxferError
from ..memory import meta as _meta
from ..memory.buffer import Buffer
from .domain import MemoryDomain, staged_backstop_s
from .transfer import HeaderStep, Transfer

if TYPE_CHECKING:
    from ..memory.cuda import CudaArray

__all__ = ["host_array", "recv_step"]


def host_array(shape: tuple[int, ...], dtype: np.dtype[Any], length: int, peer: str) -> Any:
    """A new host array for a message of ``length`` bytes from ``peer``.

    Raises:
        ProtocolError: the memory cannot be had (NumPy's MemoryError); the caller rejects
            the message.
    """
    try:
        return np.empty(shape, dtype=dtype)
    except MemoryError as exc:
        raise ProtocolError(
            f"recv from {peer}: a message of {length} bytes does not fit in this process's "
            f"memory ({exc}); the message was rejected: lower the engine's max_message_bytes "
            "(RDMAXFER_MAX_MESSAGE_BYTES) so that peers are refused such messages at once"
        ) from None


def recv_step(
    domain: MemoryDomain,
    core: _core.Endpoint,
    dest: npt.NDArray[Any] | CudaArray | None,
    gpu: int | None,
) -> HeaderStep:
    """The step that places a message announced on ``core`` (an endpoint of the engine
    ``domain``): into ``dest`` (host ndarray or GPU
    view, checked against the message), or into a new array of the sender's dtype and shape,
    on GPU ``gpu`` when it is not None (returned as a CuPy array when CuPy is importable, else
    a device :class:`~rdmaxfer.memory.buffer.Buffer`), else in host memory."""

    def step(transfer: Transfer[Any], header: _core.Request) -> _core.Request:
        msg_id, length, meta = header.message()
        rejected = False

        def reject(reason: str) -> None:
            nonlocal rejected
            rejected = True
            with contextlib.suppress(RdmaxferError):
                core.reject(msg_id, reason)

        try:
            try:
                dtype, shape = _meta.decode(meta, length)
            except RdmaxferError as exc:
                reject(f"receiver could not read the message metadata: {exc}")
                raise
            target: npt.NDArray[Any] | CudaArray
            result: object = transfer.current_result()
            if dest is not None:
                if dest.dtype != dtype or tuple(dest.shape) != shape:
                    kind = "" if isinstance(dest, np.ndarray) else "device array "
                    reason = (
                        f"the message is dtype {_meta.dtype_token(dtype)} shape {shape} "
                        f"({length} bytes) but out is {kind}dtype {_token(dest.dtype)} shape "
                        f"{tuple(dest.shape)} ({dest.nbytes} bytes)"
                    )
                    reject(reason)
                    raise InvalidArgumentError(
                        f"recv from {core.peer}: {reason}; nothing was written to out and the "
                        "message was rejected: pass an out of that dtype and shape, or "
                        "out=None to allocate one"
                    )
                target = dest
                if isinstance(dest, np.ndarray):
                    result = dest
            elif gpu is None:
                target = result = host_array(shape, dtype, length, core.peer)
            else:
                from ..gpu.staging import to_user_array

                buffer = Buffer.empty(shape, dtype, device=f"cuda:{gpu}")
                target, result = buffer.device_array(), to_user_array(buffer)
            transfer.set_result(result, length)
            expected = _meta.checksum(meta)
            # A checksummed message for GPU memory lands in host memory, is verified there,
            # then copied up: a corrupted message never reaches the device array.
            landing = target
            if expected is not None and not isinstance(target, np.ndarray):
                landing = host_array(shape, dtype, length, core.peer)
            if isinstance(landing, np.ndarray):
                region, offset, temps = domain.host_region(landing, writes=True)
                transfer.add_resources([landing, region], temps)
                if expected is not None:
                    transfer.set_on_done(_checksum_verifier(landing, expected, core.peer, target))
                return core.post_recv(msg_id, region.core, offset, length)
            stager = domain.stager(landing.device)
            direct = domain.device_direct(landing, core.transport)
            if direct is not None:  # GPUDirect or CUDA IPC: the bytes go straight into it
                region, base, temps = direct
                transfer.add_resources([landing, region], temps)
                return stager.post_recv_direct(
                    core, msg_id, region.core, base, length, staged_backstop_s()
                )
            transfer.add_resources([landing], [])
            return stager.post_recv(core, msg_id, landing.ptr, length, staged_backstop_s())
        except BaseException as exc:
            if not rejected:
                reject(f"receiver failed: {exc}")
            raise

    return step


def _token(dtype: np.dtype[Any]) -> str:
    try:
        return _meta.dtype_token(dtype)
    except InvalidArgumentError:
        return str(dtype)


def _checksum_verifier(
    landed: npt.NDArray[Any], expected: int, peer: str, target: npt.NDArray[Any] | CudaArray
) -> Callable[[], None]:
    """Verify the bytes that ``landed``; then copy them into ``target`` when that is GPU
    memory (a blocking host-to-device copy)."""

    def verify() -> None:
        got = _meta.payload_checksum(landed)
        if got != expected:
            where = "" if target is landed else "; the device array was left untouched"
            raise ChecksumError(
                f"recv from {peer}: the {landed.nbytes} bytes that arrived have XXH3-64 "
                f"{got:016x} but the sender computed {expected:016x}; the data was corrupted "
                f"on the way (check the NIC/link, or retry){where}"
            )
        if not isinstance(target, np.ndarray):
            from ..memory import cuda

            cuda.copy_from_host(target, landed)

    return verify

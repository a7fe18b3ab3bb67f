"""The metadata record a two-sided message carries: the array's dtype and shape (private).

Record, little-endian, version 1 (never pickled; every field is checked on decode)::

    0  magic     b"RXMD"
    4  version   u8 (1)
    5  dtype_len u8 (1..32)     the dtype token, ASCII: numpy's dtype.str ("<f4", "|u1", "|b1",
    6  ndim      u8 (0..64)       "<M8[ns]", "|S3"...) or an ml_dtypes name ("bfloat16",
    7  flags     u8               "float8_e4m3fn"...); bit 0: a checksum follows
    8  dtype token (dtype_len bytes), then ndim dimensions, each u64, then (flag bit 0) the
       XXH3-64 of the message's bytes, u64 (``send(..., checksum=True)``)

The byte count of the message must equal prod(shape) * itemsize.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, ProtocolError
from .dtypes import ML_NAMES, ml_dtypes_by_name

__all__ = ["MAGIC", "VERSION", "checksum", "decode", "dtype_token", "encode", "payload_checksum"]

MAGIC = b"RXMD"
VERSION = 1
MAX_DTYPE_LEN = 32
MAX_NDIM = 64
_HEAD = struct.Struct("<4sBBBB")
_DIM = struct.Struct("<Q")
FLAG_CHECKSUM = 1

# dtype kinds whose bytes mean the same thing on both sides (no pointers, no fields).
_PLAIN_KINDS = frozenset("biufcmMSUV")


def dtype_token(dtype: np.dtype[np.generic]) -> str:
    """The record's name for ``dtype``: ``dtype.str`` for numpy's types, the ml_dtypes name else.

    Raises:
        InvalidArgumentError: object or structured dtypes (their bytes do not travel).
    """
    if dtype.isbuiltin == 2:
        known_types = ml_dtypes_by_name()
        for name, known in known_types.items():
            if dtype.type is known.type:
                return name
        raise InvalidArgumentError(
            f"dtype {dtype} (a user-defined numpy type) cannot be sent; supported extension "
            f"dtypes are {', '.join(known_types)}; send arr.view(np.uint8) instead"
        )
    if dtype.hasobject:
        raise InvalidArgumentError(
            f"dtype {dtype} holds Python object pointers, which mean nothing in another "
            "process; convert the array to a numeric dtype first"
        )
    if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in _PLAIN_KINDS:
        raise InvalidArgumentError(
            f"dtype {dtype} (structured or sub-array) is not supported; send arr.view(np.uint8) "
            "and rebuild the dtype on the receiver"
        )
    return dtype.str


def dtype_from_token(token: str) -> np.dtype[np.generic]:
    if token in ML_NAMES:  # NumPy's tokens start with a byte order ("<f4", "|u1")
        known = ml_dtypes_by_name().get(token)
        if known is None:
            raise ProtocolError(
                f"message metadata names dtype {token!r}, which the installed ml_dtypes "
                "lacks; upgrade ml_dtypes (pip install -U ml_dtypes)"
            )
        return known
    try:
        dtype = np.dtype(token)
    except (TypeError, ValueError):
        raise ProtocolError(f"message metadata names an unknown dtype {token!r}") from None
    if (
        dtype.str != token
        or dtype.isbuiltin == 2
        or dtype.hasobject
        or dtype.fields is not None
        or dtype.kind not in _PLAIN_KINDS
    ):
        raise ProtocolError(f"message metadata names an unsupported dtype {token!r}")
    return dtype


def payload_checksum(array: np.ndarray[Any, Any]) -> int:
    """XXH3-64 of a C-contiguous array's bytes (the ``xxhash`` library, loaded here)."""
    import xxhash

    return int(xxhash.xxh3_64_intdigest(array.reshape(-1).view(np.uint8).data))


def encode(
    dtype: np.dtype[np.generic], shape: tuple[int, ...], checksum: int | None = None
) -> bytes:
    """Pack the record for an array of ``dtype`` and ``shape`` (and its XXH3-64 checksum).

    Raises:
        InvalidArgumentError: unsupported dtype, or more than 64 dimensions.
    """
    token = dtype_token(dtype).encode("ascii")
    if len(shape) > MAX_NDIM:
        raise InvalidArgumentError(f"an array of {len(shape)} dimensions cannot be sent (max 64)")
    flags = 0 if checksum is None else FLAG_CHECKSUM
    parts = [_HEAD.pack(MAGIC, VERSION, len(token), len(shape), flags), token]
    parts.extend(_DIM.pack(int(dim)) for dim in shape)
    if checksum is not None:
        parts.append(_DIM.pack(checksum))
    return b"".join(parts)


def checksum(meta: bytes) -> int | None:
    """The checksum carried by a record that :func:`decode` accepted, or None."""
    if meta[7] & FLAG_CHECKSUM:
        value: int = _DIM.unpack_from(meta, len(meta) - _DIM.size)[0]
        return value
    return None


def decode(meta: bytes, nbytes: int) -> tuple[np.dtype[np.generic], tuple[int, ...]]:
    """Unpack and check a record for a message of ``nbytes`` bytes.

    Returns:
        (dtype, shape), with ``prod(shape) * dtype.itemsize == nbytes``.

    Raises:
        ProtocolError: the record is malformed, of another version, or disagrees with nbytes.
    """
    if len(meta) < _HEAD.size:
        raise ProtocolError(
            f"message metadata is {len(meta)} bytes, shorter than the {_HEAD.size}-byte header; "
            "was the message sent by rdmaxfer?"
        )
    magic, version, dtype_len, ndim, flags = _HEAD.unpack_from(meta)
    if magic != MAGIC:
        raise ProtocolError(f"message metadata has bad magic {magic!r} (expected {MAGIC!r})")
    if version != VERSION:
        raise ProtocolError(
            f"message metadata version {version} is not supported (this build reads version "
            f"{VERSION}); use the same rdmaxfer version on both sides"
        )
    if flags & ~FLAG_CHECKSUM:
        raise ProtocolError(f"message metadata has unknown flags 0x{flags:02x}")
    if not 1 <= dtype_len <= MAX_DTYPE_LEN or ndim > MAX_NDIM:
        raise ProtocolError(
            f"message metadata has a dtype of {dtype_len} bytes and {ndim} dimensions "
            f"(limits: 1..{MAX_DTYPE_LEN}, 0..{MAX_NDIM})"
        )
    expected = _HEAD.size + dtype_len + ndim * _DIM.size + (_DIM.size if flags else 0)
    if len(meta) != expected:
        raise ProtocolError(f"message metadata is {len(meta)} bytes, expected {expected}")
    try:
        token = meta[_HEAD.size : _HEAD.size + dtype_len].decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("message metadata has a dtype that is not ASCII") from None
    dtype = dtype_from_token(token)
    offset = _HEAD.size + dtype_len
    shape = tuple(_DIM.unpack_from(meta, offset + i * _DIM.size)[0] for i in range(ndim))
    if any(dim >= 2**63 for dim in shape):
        raise ProtocolError(f"message metadata has an impossible shape {shape}")
    declared = math.prod(shape) * dtype.itemsize
    if declared != nbytes:
        raise ProtocolError(
            f"message metadata says dtype {token} shape {shape} ({declared} bytes) but the "
            f"message carries {nbytes} bytes"
        )
    return dtype, shape

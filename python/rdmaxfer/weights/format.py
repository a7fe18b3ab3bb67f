"""The weights protocol's vocabulary: safetensors dtype names, the published-tensor record,
the JSON messages, and safetensors files (read a header, write a pulled copy). The protocol
itself is described in :mod:`rdmaxfer.weights`."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, ProtocolError
from ..memory.dtypes import DtypeTable

__all__ = [
    "DTYPES",
    "PROTOCOL_VERSION",
    "TensorInfo",
    "decode",
    "dtype_names",
    "encode",
    "name_of",
    "read_safetensors_header",
    "save_safetensors_copy",
]

PROTOCOL_VERSION = 3

#: safetensors dtype name -> dtype (ml_dtypes is imported on the first lookup of BF16 or F8_*).
DTYPES: DtypeTable[str] = DtypeTable(
    [
        ("F64", np.dtype(np.float64)),
        ("F32", np.dtype(np.float32)),
        ("F16", np.dtype(np.float16)),
        ("BF16", "bfloat16"),
        ("F8_E4M3", "float8_e4m3fn"),
        ("F8_E5M2", "float8_e5m2"),
        ("I64", np.dtype(np.int64)),
        ("I32", np.dtype(np.int32)),
        ("I16", np.dtype(np.int16)),
        ("I8", np.dtype(np.int8)),
        ("U64", np.dtype(np.uint64)),
        ("U32", np.dtype(np.uint32)),
        ("U16", np.dtype(np.uint16)),
        ("U8", np.dtype(np.uint8)),
        ("BOOL", np.dtype(np.bool_)),
    ]
)


def name_of(dtype: npt.DTypeLike) -> str | None:
    """The safetensors name of ``dtype`` (``"F32"``, ``"BF16"``...), None when it has none."""
    return DTYPES.key_of(dtype)


def dtype_names() -> str:
    """The dtypes that have a safetensors name, for error messages (``"float64, ..."``)."""
    return ", ".join(str(DTYPES[name]) for name in DTYPES)


@dataclass(frozen=True)
class TensorInfo:
    """One published tensor: safetensors dtype name, shape, region index and byte offset."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    region: int
    offset: int

    @property
    def nbytes(self) -> int:
        """Size in bytes (dtype itemsize times the product of the shape)."""
        return DTYPES[self.dtype].itemsize * int(np.prod(self.shape, dtype=np.int64))


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[bytes, dict[str, Any], int]:
    """Read a ``.safetensors`` file's header.

    Returns:
        (raw header bytes including the 8-byte size prefix, parsed JSON, offset in bytes of
        the data section).

    Raises:
        InvalidArgumentError: not a readable safetensors file (the message says why).
    """
    from safetensors import safe_open

    p = Path(path)
    try:
        with safe_open(str(p), framework="numpy"):
            pass  # the library checks the header, dtypes and offsets against the file size
        with p.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            raw = f.read(size)
    except (OSError, struct.error, Exception) as exc:
        raise InvalidArgumentError(
            f"{str(p)!r} is not a readable safetensors file: {exc}; pass a .safetensors file"
        ) from exc
    header: dict[str, Any] = json.loads(raw)
    return struct.pack("<Q", size) + raw, header, 8 + size


def encode(obj: Mapping[str, Any]) -> npt.NDArray[np.uint8]:
    return np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8).copy()


def decode(arr: npt.NDArray[Any], what: str) -> dict[str, Any]:
    try:
        obj = json.loads(arr.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"malformed {what} message: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("v") != PROTOCOL_VERSION:
        version = obj.get("v") if isinstance(obj, dict) else None
        raise ProtocolError(
            f"{what} message of an unsupported version {version!r} (this build speaks version "
            f"{PROTOCOL_VERSION}); use the same rdmaxfer on both sides"
        )
    return obj


def save_safetensors_copy(
    arrays: Mapping[str, npt.NDArray[Any]], path: str | os.PathLike[str]
) -> None:
    """Write pulled tensors as a ``.safetensors`` file.

    With the ``"__header__"`` entry from ``pull_weights(..., with_header=True)`` the server's
    header and layout are reproduced byte for byte; otherwise the ``safetensors`` library
    writes a fresh file.
    """
    header = arrays.get("__header__")
    tensors = {k: v for k, v in arrays.items() if k != "__header__"}
    if header is None:
        from safetensors.numpy import save_file

        save_file(dict(tensors), str(path))
        return
    parsed: dict[str, Any] = json.loads(header[8:].tobytes())
    data_len = max(
        (int(e["data_offsets"][1]) for k, e in parsed.items() if k != "__metadata__"), default=0
    )
    data = np.zeros(data_len, dtype=np.uint8)
    for name, entry in parsed.items():
        if name == "__metadata__":
            continue
        begin, end = (int(x) for x in entry["data_offsets"])
        data[begin:end] = np.ascontiguousarray(tensors[name]).view(np.uint8).reshape(-1)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(data.tobytes())

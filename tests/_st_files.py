"""Small safetensors files for the local-disk tests, written byte by byte (every dtype the
weights API takes, including BF16 and F8, which the safetensors library's NumPy writer lacks)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from rdmaxfer.weights.format import DTYPES


def random_tensors(rng: np.random.Generator, count: int = 6) -> dict[str, np.ndarray]:
    """One tensor per dtype the weights API takes (random bytes), then ``count`` F32 ones."""
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(DTYPES):
        dtype = DTYPES[name]
        raw = rng.integers(0, 256, size=(3 + i) * 5 * dtype.itemsize, dtype=np.uint8)
        out[f"t_{name.lower()}"] = raw.view(dtype).reshape(3 + i, 5)
    for i in range(count):
        out[f"w{i}"] = rng.standard_normal((17 + 3 * i, 33)).astype(np.float32)
    return out


def write(path: Path, tensors: dict[str, np.ndarray], align: int = 1) -> Path:
    """``tensors`` as a safetensors file at ``path`` (each tensor's data offset a multiple of
    ``align``; 1, no gaps, is what the safetensors library accepts)."""
    header: dict[str, Any] = {"__metadata__": {"format": "np"}}
    offset = 0
    for name, arr in tensors.items():
        offset = -(-offset // align) * align
        key = DTYPES.key_of(arr.dtype)
        header[name] = {
            "dtype": key,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = bytearray(offset)
    for name, arr in tensors.items():
        begin = header[name]["data_offsets"][0]
        data[begin : begin + arr.nbytes] = np.ascontiguousarray(arr).tobytes()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data))
    return path


def write_sharded(folder: Path, tensors: dict[str, np.ndarray], files: int) -> Path:
    """``tensors`` split over ``files`` files ``model-0000K-of-0000N.safetensors`` and their
    index ``model.safetensors.index.json`` (returned)."""
    names = list(tensors)
    weight_map = {}
    for k in range(files):
        file_name = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
        part = {n: tensors[n] for n in names[k::files]}
        write(folder / file_name, part)
        weight_map.update(dict.fromkeys(part, file_name))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index

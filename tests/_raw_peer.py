"""A stranger at an engine's TCP listener, speaking the wire records by hand (the layouts of
csrc/transport/bootstrap.h and csrc/transport/tcp/wire.h): hellos, control frames, replies."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

import numpy as np

TCP = 1
MSG_RTS = 5
MSG_EAGER = 6
MSG_REJECT = 8
FLAG_TLS = 2  # the Hello's flag: this side speaks TLS
FRAME = struct.Struct("<HBBIQQQQIIQQ")  # the 64-byte frame header


def hello(stream_index: int = 0, n_streams: int = 1, conn_id: int = 22, flags: int = 0) -> bytes:
    """A Hello of a TCP client without a secret (``flags``: FLAG_TLS for one that speaks TLS)."""
    return b"RXHI" + struct.pack("<HBBBB6xQQ", 1, TCP, stream_index, n_streams, flags, 11, conn_id)


def connect(port: int, source: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    """A TCP connection to 127.0.0.1:port from the loopback address ``source``."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def handshake(
    port: int, *, source: str = "127.0.0.1", stream_index: int = 0, n_streams: int = 1,
    conn_id: int = 22,
) -> socket.socket:  # fmt: skip
    """A stream past the handshake (the HelloAck read and checked: status 0)."""
    s = connect(port, source)
    s.sendall(hello(stream_index, n_streams, conn_id))
    ack = recv_exact(s, 16)
    assert ack[:4] == b"RXOK" and ack[6:8] == b"\0\0", ack
    return s


def frame(kind: int, *, req_id: int = 1, size: int = 0, meta: bytes = b"") -> bytes:
    """A frame header with ``meta`` after it (no payload)."""
    return FRAME.pack(0x5852, 1, kind, 0, req_id, 0, size, 0, 0, len(meta), 0, 0) + meta


def read_frame(s: socket.socket) -> tuple[int, int, bytes]:
    """The next frame: (type, req_id, meta); its payload, if any, is read and dropped."""
    fields = FRAME.unpack(recv_exact(s, FRAME.size))
    kind, req_id, meta_len, payload_len = fields[2], fields[4], fields[9], fields[10]
    meta = recv_exact(s, meta_len) if meta_len else b""
    if payload_len:
        recv_exact(s, payload_len)
    return kind, req_id, meta


def write_safetensors(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """A .safetensors file of uint8 arrays (the format: an 8-byte header length, a JSON
    header, the data)."""
    header: dict[str, object] = {}
    offset = 0
    for name, a in arrays.items():
        header[name] = {
            "dtype": "U8",
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for a in arrays.values():
            f.write(a.tobytes())

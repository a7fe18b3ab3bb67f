"""rdmaxfer: move large buffers between machines (TCP now, RDMA verbs later) into NumPy arrays.

Quick start::

    import rdmaxfer
    arr = rdmaxfer.recv(listen=":5555")            # receiver
    rdmaxfer.send(arr, to="receiver-host:5555")    # sender

See :class:`Engine` and :class:`Endpoint` for connections, one-sided READ/WRITE into
registered memory (:class:`MemoryRegion`) and the asyncio / posted forms of every operation.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from .api import accept, connect, default_engine, listen, recv, send, shutdown
from .buffer import Buffer, MemoryRegion, as_array
from .endpoint import Endpoint
from .engine import Engine, resolve_transport
from .errors import (
    ChecksumError,
    ConnectionFailedError,
    EndpointClosedError,
    FetchError,
    FetchIntegrityError,
    InvalidArgumentError,
    ProtocolError,
    RdmaxferError,
    RegistrationError,
    RemoteAccessError,
    TransferTimeoutError,
    TransportError,
    UnsupportedError,
)
from .fetch import FetchResult, fetch, fetch_weights
from .transfer import Transfer
from .weights import WeightServer, pull_weights, serve_weights

try:
    __version__ = _metadata.version("rdmaxfer")
except _metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0+unknown"

__all__ = [
    "Buffer",
    "ChecksumError",
    "ConnectionFailedError",
    "Endpoint",
    "EndpointClosedError",
    "Engine",
    "FetchError",
    "FetchIntegrityError",
    "FetchResult",
    "InvalidArgumentError",
    "MemoryRegion",
    "ProtocolError",
    "RdmaxferError",
    "RegistrationError",
    "RemoteAccessError",
    "Transfer",
    "TransferTimeoutError",
    "TransportError",
    "UnsupportedError",
    "WeightServer",
    "__version__",
    "accept",
    "as_array",
    "connect",
    "default_engine",
    "fetch",
    "fetch_weights",
    "listen",
    "pull_weights",
    "recv",
    "resolve_transport",
    "send",
    "serve_weights",
    "shutdown",
]

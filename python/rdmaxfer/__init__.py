"""rdmaxfer: move large buffers between machines (TCP now, RDMA verbs later) into NumPy arrays.

Quick start::

    import rdmaxfer
    arr = rdmaxfer.recv(listen=":5555")            # receiver
    rdmaxfer.send(arr, to="receiver-host:5555")    # sender

See :class:`Engine` and :class:`Endpoint` for connections, one-sided READ/WRITE into
registered memory (:class:`MemoryRegion`) and the asyncio / posted forms of every operation;
``Endpoint.write_batch`` / ``read_batch`` / ``prepare_batch`` for batches of them
(:class:`BatchResult`, :class:`PreparedBatch`) and ``Engine.wait_notification`` for the
payloads (:data:`Notify`) a peer's WRITEs carry.
"""

from __future__ import annotations

# NumPy first: everything below needs it, and the standard modules it loads (typing, re...)
# are then counted as NumPy's in `python -X importtime`, not as rdmaxfer's.
import numpy as _numpy  # noqa: F401  (loaded for its side effect, see above)

# isort: split
from typing import TYPE_CHECKING, Any

from ._core import Descriptor
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
from .memory.buffer import Buffer, as_array
from .memory.region import MemoryRegion
from .options import EngineOptions, RdmaOptions, ShmOptions, TcpOptions
from .transport.api import accept, connect, default_engine, listen, recv, send, shutdown
from .transport.batch import BatchResult, Notify, PreparedBatch
from .transport.endpoint import Endpoint
from .transport.engine import Engine, resolve_transport
from .transport.transfer import Transfer

if TYPE_CHECKING:
    from .tools.fetch import FetchResult, fetch, fetch_weights
    from .weights import (
        LoadedWeights,
        PulledWeights,
        WeightReceiver,
        WeightServer,
        load_weights,
        pull_weights,
        push_weights,
        receive_weights,
        save_weights,
        serve_weights,
    )

    __version__: str

# Loaded on first use (module __getattr__, PEP 562), to keep `import rdmaxfer` fast: HTTP
# downloads (httpx, asyncio) and the weights protocol, and the modules that only some programs
# need (GPU memory, torch.distributed-style collectives, the CLI's tools), under the short
# names they had before the package was split into layers (``rdmaxfer.cuda``...).
_LAZY = {
    "FetchResult": "tools.fetch",
    "fetch": "tools.fetch",
    "fetch_weights": "tools.fetch",
    "LoadedWeights": "weights",
    "load_weights": "weights",
    "PulledWeights": "weights",
    "WeightReceiver": "weights",
    "WeightServer": "weights",
    "pull_weights": "weights",
    "push_weights": "weights",
    "receive_weights": "weights",
    "save_weights": "weights",
    "serve_weights": "weights",
}
_SUBMODULES = {
    "bench": "tools.bench",
    "cli": "tools.cli",
    "cuda": "memory.cuda",
    "distributed": "distributed",
    "doctor": "tools.doctor",
    "gpudirect": "gpu.gpudirect",
    "staging": "gpu.staging",
    "topology": "gpu.topology",
    "weights": "weights",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    elif name == "__version__":
        from importlib import metadata

        try:
            value = metadata.version("rdmaxfer")
        except metadata.PackageNotFoundError:  # running from a source tree without installing
            value = "0+unknown"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))


__all__ = [
    "BatchResult",
    "Buffer",
    "ChecksumError",
    "ConnectionFailedError",
    "Descriptor",
    "Endpoint",
    "EndpointClosedError",
    "Engine",
    "EngineOptions",
    "FetchError",
    "FetchIntegrityError",
    "FetchResult",
    "InvalidArgumentError",
    "LoadedWeights",
    "MemoryRegion",
    "Notify",
    "PreparedBatch",
    "ProtocolError",
    "PulledWeights",
    "RdmaOptions",
    "RdmaxferError",
    "RegistrationError",
    "RemoteAccessError",
    "ShmOptions",
    "TcpOptions",
    "Transfer",
    "TransferTimeoutError",
    "TransportError",
    "UnsupportedError",
    "WeightReceiver",
    "WeightServer",
    "__version__",
    "accept",
    "as_array",
    "connect",
    "default_engine",
    "fetch",
    "fetch_weights",
    "listen",
    "load_weights",
    "pull_weights",
    "push_weights",
    "receive_weights",
    "recv",
    "resolve_transport",
    "save_weights",
    "send",
    "serve_weights",
    "shutdown",
]

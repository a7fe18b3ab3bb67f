"""Model weights straight into arrays: publish tensors, pull them with one-sided READs.

The server (:class:`WeightServer`, ``rdmaxfer serve``) registers the tensors for remote READ:
a ``.safetensors`` file is memory-mapped and registered as one region (no copy; the pages are
read from the page cache as the peer asks for them), a dict of arrays is registered array by
array. A client (:func:`pull_weights`, ``rdmaxfer pull``) asks for the catalog, allocates
arrays of the right dtype and shape, and fills them with READs straight from the server's
memory; the server's CPU only serves the bytes.

Protocol (two-sided messages on one endpoint, each a 1-D ``uint8`` array holding UTF-8 JSON):

1. client -> server ``{"v": 1, "op": "catalog"}``
2. server -> client ``{"v": 1, "regions": [<descriptor hex>, ...], "header": <hex or null>,
   "tensors": {name: {"dtype": "F32", "shape": [...], "region": i, "offset": bytes}}}``;
   ``dtype`` uses safetensors' names (F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL
   F8_E4M3 F8_E5M2), ``offset`` is the tensor's first byte in region ``i``, and ``header`` is
   the file's raw safetensors header (so a client can write a bit-exact copy).
3. client READs the bytes, then sends ``{"v": 1, "op": "done"}`` and closes.

GPU memory: :class:`WeightServer` publishes GPU-resident tensors (a dict of CuPy/PyTorch
arrays, for trainer -> inference weight sync) registered for GPUDirect RDMA where the engine
can, else through a pinned host mirror that :meth:`WeightServer.refresh` updates;
``pull_weights(..., device="cuda:0")`` fills GPU arrays (GPUDirect READs into registered GPU
memory, else the staging pipeline).

dtypes: BF16 and the F8 types arrive as ``ml_dtypes`` arrays (``ml_dtypes.bfloat16`` ...),
which NumPy, safetensors and JAX accept; nothing is converted.

The safetensors layout (8-byte little-endian header size, JSON header, data) is read from the
file's header; the file is first validated with the ``safetensors`` library.
"""

from __future__ import annotations

from .format import DTYPES, TensorInfo, read_safetensors_header, save_safetensors_copy
from .pull import pull_weights
from .server import WeightServer, serve_weights

__all__ = [
    "DTYPES",
    "TensorInfo",
    "WeightServer",
    "pull_weights",
    "read_safetensors_header",
    "save_safetensors_copy",
    "serve_weights",
]

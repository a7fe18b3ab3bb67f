"""Model weights straight into arrays: publish tensors (in versions), pull them (whole, by
name, or sharded) with one-sided READs, or push them with one-sided WRITEs.

The server (:class:`WeightServer`, ``rdmaxfer serve``) registers the tensors for remote READ
from memory it owns: a ``.safetensors`` file is read into memory whole and registered as one
region, each array of a dict is copied into a registered buffer of its own (a GPU tensor
into server-owned GPU memory where the engine reaches peers by GPUDirect RDMA). A client
(:func:`pull_weights`, ``rdmaxfer pull``) asks for the catalog, allocates arrays of the right
dtype and shape, and fills them with READs straight from the server's memory; the server's
CPU only serves the bytes.

Protocol (two-sided messages on one endpoint, each a 1-D ``uint8`` array holding UTF-8 JSON):

1. client -> server ``{"v": 3, "op": "catalog", "min_version": m, "wait_s": s}`` (the server
   waits up to ``s`` seconds for version ``m``, then answers with its current version);
2. server -> client ``{"v": 3, "version": n, "regions": [<descriptor hex>, ...], "header":
   <hex or null>, "tensors": {name: {"dtype": "F32", "shape": [...], "region": i, "offset":
   bytes}}}``; ``dtype`` uses safetensors' names (F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16
   U8 BOOL F8_E4M3 F8_E5M2), ``offset`` is the tensor's first byte in region ``i``, and
   ``header`` is the file's raw safetensors header (version 1 of a file only), so a client can
   write a bit-exact copy. From this answer until the client's "done" (or its endpoint
   closing) the client holds version ``n``: the server never rewrites its memory meanwhile.
3. client READs the bytes (whole tensors, or the pieces of its shards) in one batch
   (``Endpoint.read_batch``), then sends ``{"v": 3, "op": "done"}`` and closes.

Versions (:mod:`.versions`): version 1 is the server's copy of the source, made when it is
published; each :meth:`WeightServer.update` / :meth:`~WeightServer.refresh` copies the new
values into one of two server-owned registered buffers that no client holds (double
buffering), then makes it current. So a pull returns exactly the bytes of one version
(``PulledWeights.version``), whatever the publisher writes into its arrays (or the file)
afterwards; see docs/weights-versions.md.

Push (:mod:`.push`): :func:`receive_weights` registers the receiver's arrays,
:func:`push_weights` WRITEs every tensor into them in one batch (``Endpoint.write_batch``)
whose notification announces the version, which :meth:`WeightReceiver.wait` returns.

GPU memory: :class:`WeightServer` publishes GPU-resident tensors (a dict of CuPy/PyTorch
arrays, for trainer -> inference weight sync) registered for GPUDirect RDMA where the engine
can, else through a host copy; later versions (:meth:`WeightServer.update`/``refresh``) live
in host memory. ``pull_weights(..., device="cuda:0")`` and ``into=`` GPU arrays are filled by
GPUDirect READs into registered GPU memory, else through the staging pipeline.

dtypes: BF16 and the F8 types arrive as ``ml_dtypes`` arrays (``ml_dtypes.bfloat16`` ...),
which NumPy, safetensors and JAX accept; nothing is converted.

Local disk (:mod:`.loading`): :func:`load_weights` reads a safetensors checkpoint (one file or
an index and its shards) with O_DIRECT reads through io_uring into new host or GPU arrays, or
into the caller's; :func:`save_weights` writes one with O_DIRECT writes, fsync'ed and renamed
into place (see docs/loading.md).

The safetensors layout (8-byte little-endian header size, JSON header, data) is read from the
file's header; the file is first validated with the ``safetensors`` library.
"""

from __future__ import annotations

from .format import DTYPES, TensorInfo, read_safetensors_header, save_safetensors_copy
from .loading import FileLoad, LoadedWeights, load_weights
from .pull import PulledWeights, pull_weights
from .push import WeightReceiver, push_weights, receive_weights
from .saving import SavedFile, save_weights
from .server import WeightServer, serve_weights

__all__ = [
    "DTYPES",
    "FileLoad",
    "LoadedWeights",
    "PulledWeights",
    "SavedFile",
    "TensorInfo",
    "WeightReceiver",
    "WeightServer",
    "load_weights",
    "pull_weights",
    "push_weights",
    "read_safetensors_header",
    "receive_weights",
    "save_safetensors_copy",
    "save_weights",
    "serve_weights",
]

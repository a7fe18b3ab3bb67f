"""Type stubs for the C++ extension ``rdmaxfer._core`` (csrc/bindings/module.cc).

Lengths and offsets are in bytes; timeouts in seconds (finite). Every blocking call releases the
GIL. Errors are raised as the classes of :mod:`rdmaxfer.errors`.
"""

import builtins
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

ACCESS_LOCAL: int
ACCESS_REMOTE_READ: int
ACCESS_REMOTE_WRITE: int
ACCESS_LOCAL_WRITE: int  # local operations may write the region (READ/RECV destination)

def available_transports() -> dict[str, str]:
    """Transport name -> "" when usable here, else the reason it is not."""

def transports() -> dict[str, dict[str, Any]]:
    """Every transport of this build by name: its declared capabilities (``name``,
    ``wire_id``, ``listed``, ``network``, ``auto_rank``, ``same_host_companion``,
    ``bootstrap``, ``one_sided``, ``write_with_imm``, ``gpu_direct``, ``device_ipc``, ``rails``,
    ``max_message``) and ``unavailable`` ("" when it can run here)."""

def automatic_network_transport() -> str:
    """The network transport ``transport="auto"`` picks here (the usable one of highest
    ``auto_rank``); UnsupportedError when none can run."""

def choose_automatic(candidates: list[tuple[str, int, str]]) -> tuple[str, str]:
    """``transport="auto"``'s rule over ``(name, auto_rank, why auto may not take it)``
    triples ("" when it may): ``(the name taken, why)``; UnsupportedError with every refusal
    when none may be taken."""

def ofi_providers(with_emulated: bool = False) -> list[dict[str, Any]]:
    """libfabric's FI_EP_RDM providers as the ofi transport decides them."""

def ofi_decide_settings(
    provider: str,
    domain: str = "",
    caps: int = 0,
    ep_type: int = ...,
    mr_mode: int = 0,
    cq_data_size: int = 0,
    mr_key_size: int = 0,
    max_msg_size: int = 0,
    inject_size: int = 0,
    tx_op_flags: int = 0,
) -> dict[str, Any]:
    """What the ofi transport decides from an fi_info with these fields."""

OFI_BITS: dict[str, int]

def host_identity() -> dict[str, str | int]:
    """This process as the shm handshake announces it: ``boot_id``
    (/proc/sys/kernel/random/boot_id), ``netns`` (readlink /proc/self/ns/net), ``uid``
    (effective), ``pid``."""

def same_host_mismatch(boot_id: str, netns: str, uid: int, pid: int, peer_pid: int) -> str:
    """ "" when a peer announcing these values (``peer_pid``: its pid as SO_PEERCRED reports it
    here) can use shm with this process, else the reason, naming the fix."""

def yama_ptrace_scope() -> int:
    """/proc/sys/kernel/yama/ptrace_scope, or -1 without Yama."""

def record_kinds() -> list[str]:
    """Wire records parse_record() knows ("descriptor", "hello", "frame", ...)."""

def parse_record(kind: str, data: bytes) -> str:
    """Parse ``data`` as the wire record ``kind`` (for fuzzing and tests); a summary of what
    was accepted, or ProtocolError."""

def refresh_log_level() -> None:
    """Re-read the "rdmaxfer" logger's effective level into the core, which forwards its
    messages (connection set-up, teardown, failures) to that logger; also done at every
    Engine(), connect() and accept()."""

def memlock_limit() -> str:
    """The RLIMIT_MEMLOCK soft limit as ``ulimit -l`` prints it ("unlimited" or "N KiB")."""

def begin_exit() -> None:
    """Marks the interpreter as exiting (called by the atexit hook of
    :mod:`rdmaxfer.transport.lifecycle` before it closes the engines): from then on a thread
    other than the caller that returns from, or enters, a core call that released the GIL
    sleeps until the process ends instead of running Python again."""

def address_of(obj: object) -> int:
    """The address of the first byte of a C-contiguous buffer-protocol object (numpy's
    ``__array_interface__["data"][0]``); the exporter's error when it has no contiguous buffer
    (numpy: ValueError), TypeError when it exposes none."""

class Descriptor:
    """Names a registered region for a peer: versioned little-endian record, ``SIZE`` (40)
    bytes, plus 4 per extra rail of a multi-rail rdma engine (``rail_keys``)."""

    SIZE: int
    @property
    def transport(self) -> str: ...
    @property
    def access(self) -> int: ...
    @property
    def addr(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def key(self) -> int: ...
    @property
    def rail_keys(self) -> list[int]:
        """The rkeys on the registering engine's rails 1, 2, ... ([] on one rail)."""
    @property
    def generation(self) -> int:
        """Returns of the registering engine's devices when the keys were read (docs/rails.md)."""
    @property
    def engine_id(self) -> int: ...
    def pack(self) -> bytes: ...
    @staticmethod
    def unpack(data: bytes) -> Descriptor: ...

class Region:
    """A registered memory region. Supports the buffer protocol (1-D bytes, writable)."""

    @property
    def addr(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def key(self) -> int: ...
    @property
    def access(self) -> int:
        """The remote access bits (ACCESS_REMOTE_READ / ACCESS_REMOTE_WRITE)."""
    @property
    def local_write(self) -> bool:
        """True when local operations may write the region (a READ or RECV destination)."""
    @property
    def pinned(self) -> bool: ...
    @property
    def registered(self) -> bool: ...
    @property
    def home_rail(self) -> int:
        """The rail (index into ``Engine.rails()``) that transfers too small to stripe use
        from this region: the NIC nearest its GPU; -1: none (the least loaded rail)."""
    @home_rail.setter
    def home_rail(self, rail: int) -> None: ...
    def descriptor(self) -> Descriptor: ...

class Request:
    """A posted operation. Terminal once done() is True; check() raises its error."""

    @property
    def id(self) -> int: ...
    @property
    def op(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def moved(self) -> int:
        """Bytes moved so far (noted by the transport, or the share of finished parts)."""
    def idle(self) -> float:
        """Seconds since the request last made progress (or was posted)."""
    def done(self) -> bool: ...
    def failed(self) -> bool: ...
    def wait(self, timeout: float) -> bool:
        """Block until terminal (True) or the timeout (False). Ctrl-C interrupts it."""
    def check(self) -> None:
        """Raise the request's error if it failed."""
    def message(self) -> tuple[int, int, builtins.bytes]:
        """For a header request: (msg_id, length in bytes, meta)."""
    def watch(self, engine: Engine) -> None:
        """Report this request's id on engine.notify_fd once it is terminal."""

class Endpoint:
    @property
    def peer(self) -> str: ...
    @property
    def transport(self) -> str:
        """The transport carrying this connection: "tcp", "rdma" or "shm"."""
    @property
    def transport_note(self) -> str:
        """Why shm was not chosen ("shm not used: ...") or ""."""
    @property
    def streams(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def error(self) -> str: ...
    def describe(self) -> str:
        """One line: the peer, the streams/QPs and what was negotiated with the peer."""
    def attributes(self) -> dict[str, int | str]:
        """Negotiated numbers by name (verbs: path_mtu, max_rd_atomic, max_dest_rd_atomic...)
        and names (ofi: provider, fabric, domain)."""
    def stats(self) -> dict[str, int]:
        """This connection's counters by name (keys in rdmaxfer/transport/stats.py)."""
    def post_write(
        self,
        local: Region,
        local_offset: int,
        remote: Descriptor,
        remote_offset: int,
        length: int,
        chunk_size: int = 0,
        streams: int = 0,
    ) -> Request: ...
    def post_read(
        self,
        local: Region,
        local_offset: int,
        remote: Descriptor,
        remote_offset: int,
        length: int,
        chunk_size: int = 0,
        streams: int = 0,
    ) -> Request: ...
    def post_send(
        self,
        local: Region,
        offset: int,
        length: int,
        meta: bytes,
        chunk_size: int = 0,
        streams: int = 0,
    ) -> Request: ...
    def post_write_wait(
        self,
        local: Region,
        local_offset: int,
        remote: Descriptor,
        remote_offset: int,
        length: int,
        chunk_size: int,
        streams: int,
        wait: float,
        slot: list[Request | None],
    ) -> bool:
        """post_write and Request.wait(wait) in one call: True when the WRITE completed;
        else (failed, pending at the bound, or a signal handler raised) the request is put in
        slot[0] (a list of one item) first."""
    def post_read_wait(
        self,
        local: Region,
        local_offset: int,
        remote: Descriptor,
        remote_offset: int,
        length: int,
        chunk_size: int,
        streams: int,
        wait: float,
        slot: list[Request | None],
    ) -> bool:
        """post_read and Request.wait(wait) in one call, as post_write_wait."""
    def post_send_wait(
        self,
        local: Region,
        offset: int,
        length: int,
        meta: bytes,
        chunk_size: int,
        streams: int,
        wait: float,
        slot: list[Request | None],
    ) -> bool:
        """post_send and Request.wait(wait) in one call, as post_write_wait."""
    def post_recv_header(self) -> Request: ...
    def post_recv(self, msg_id: int, local: Region, offset: int, length: int) -> Request: ...
    def reject(self, msg_id: int, reason: str) -> None: ...
    def cancel_recv_header(self, request: Request) -> bool: ...
    def close(self) -> None: ...
    def begin_close(self) -> None: ...
    def abort(self, reason: str, timed_out: bool = False) -> None: ...
    def timed_loop(
        self,
        op: str,
        local: Region,
        local_offset: int,
        remote: Descriptor,
        remote_offset: int,
        length: int,
        iters: int,
        warmup: int,
        inflight: int,
        timeout: float = 60.0,
    ) -> list[float]:
        """Benchmark loop in C++ (GIL released): ``warmup`` untimed then ``iters`` timed
        ``op`` ("write" or "read") operations; returns ``iters`` durations in seconds.

        ``inflight=1``: each entry is post -> completion of one operation (latency).
        ``inflight>1``: that many stay posted; entry i is the time between completions i-1 and i
        (their sum runs from the first timed post to the last completion: bandwidth). Each wait
        drives the transport itself (verbs: polls the CQ) for up to 1 ms before it sleeps;
        ``timeout`` bounds each operation.
        """

class Engine:
    def __init__(
        self,
        transport: str = "tcp",
        io_threads: int = 0,
        socket_buffer: int = 0,
        default_streams: int = 0,
        rdma_device: str = "",
        gid_index: int = -1,
        poll_mode: str = "",
        secret: str = "",
        rdma_devices: list[str] = ...,
        service_level: int = -1,
        traffic_class: int = -1,
        min_rnr_timer: int = -1,
        settings: dict[str, str] = ...,
        max_message_bytes: int = 0,
    ) -> None:
        """``transport``: a name of :func:`transports` (listed ones, or "loopback": the
        internal in-process test transport), or "auto": the usable network transport of
        highest ``auto_rank``, plus the same-host companion for peers on this host
        (csrc/engine/wireup.h). ``settings``: a transport's own settings as text by
        "<transport>.<name>" (each transport parses and checks its own; the rdma keywords below
        fill "rdma.*").
        ``default_streams``: TCP streams or RC QPs per connection (0: 4 on TCP, 1 on rdma).
        ``secret``: shared secret for the bootstrap's HMAC-SHA256 challenge-response ("" =
        none; see csrc/transport/auth.h).

        rdma only: ``rdma_devices`` (the rails: names, or ["auto"] for every device with an
        active port; [] -> ``rdma_device``), ``rdma_device`` ("" -> env RDMAXFER_RDMA_DEVICES
        -> env RDMAXFER_RDMA_DEVICE -> the first device with an active port); ``service_level``
        0..15, ``traffic_class`` 0..255, ``min_rnr_timer`` 0..31 (-1 -> env
        RDMAXFER_SERVICE_LEVEL / RDMAXFER_TRAFFIC_CLASS / RDMAXFER_MIN_RNR_TIMER -> 0 / 0 / 18;
        InvalidArgumentError outside the range; applied to the QPs of every rail); ``gid_index``
        (-1 -> env RDMAXFER_GID_INDEX -> auto: the first RoCE v2 GID holding an IPv4-mapped
        address); ``poll_mode`` (every transport: "adaptive", "busy" or "event"; "" -> env
        RDMAXFER_POLL_MODE -> "adaptive"; InvalidArgumentError for another value; on rdma
        "busy" spins on the CQ and the others sleep on the completion channel).
        """
    @property
    def transport(self) -> str:
        """The transport holding the registrations (with "auto": the network transport)."""
    @property
    def automatic(self) -> bool: ...
    @property
    def auto_why(self) -> str:
        """With ``transport="auto"``, why it took its network transport; else ""."""
    @property
    def has_shm_companion(self) -> bool:
        """With "auto": the engine has a same-host shm companion (GPU memory registered on it
        over TCP is exported for CUDA IPC)."""
    @property
    def shm_off(self) -> str:
        """ "" when same-host peers get shm (or the transport was forced), else why not."""
    @property
    def engine_id(self) -> int: ...
    @property
    def notify_fd(self) -> int: ...
    def capabilities(self) -> dict[str, int | bool | str]: ...
    def describe(self) -> str: ...
    @property
    def gpu_direct_off(self) -> str:
        """Why this engine's transport does not register GPU memory with its NIC although its
        kind may (ofi: the provider granted no FI_HMEM); "" otherwise."""
    def rails(self) -> list[str]:
        """The devices of an rdma engine, in rail order ([] on other transports)."""
    def stats(self) -> dict[str, int]:
        """Counters of every connection made, open or closed, and of failed set-ups."""
    def listen(self, host: str, port: int) -> int: ...
    def accept(self, timeout: float) -> Endpoint: ...
    def connect(
        self, host: str, port: int, streams: int, timeout: float, retry_refused: bool = True
    ) -> Endpoint: ...
    def register(self, addr: int, length: int, access: int) -> Region: ...
    def alloc_pinned(self, length: int, access: int) -> Region: ...
    def register_device(
        self, addr: int, length: int, access: int, method: str, device: int
    ) -> Region:
        """Register GPU memory for GPUDirect RDMA: ``method`` "dmabuf"
        (cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr) or "peermem" (ibv_reg_mr on the
        device pointer). UnsupportedError on TCP; RegistrationError names cause and fix."""
    def deregister(self, region: Region, timeout: float) -> None: ...
    def drain_notifications(self) -> list[int]: ...
    def registered_count(self) -> int: ...
    def close(self) -> None: ...

# -- GPU memory (csrc/cuda) -------------------------------------------------------------------

def cuda_status() -> dict[str, Any]:
    """{"unavailable": reason or "", "driver_version": int, "get_handle_for_address_range":
    bool, "gpus": [{"index", "name", "pci_bus_id", "total_memory", "compute_capability",
    "gpu_direct_rdma", "dma_buf"}]}; never raises."""

def verbs_dmabuf_unavailable() -> str:
    """ "" when libibverbs has ibv_reg_dmabuf_mr, else why not."""

def cuda_allocation(addr: int) -> tuple[int, int, int]:
    """The device allocation holding ``addr``: (base, bytes, CU_POINTER_ATTRIBUTE_BUFFER_ID, 0
    when the driver does not report it). Raises UnsupportedError without CUDA,
    InvalidArgumentError for memory that is not device memory."""

def pointer_kind(addr: int) -> tuple[str, int]:
    """("host" | "pinned" | "device" | "managed", device ordinal or -1)."""

def cuda_synchronize_stream(device: int, stream: int) -> None:
    """cuStreamSynchronize on a foreign stream handle (1: legacy default, 2: per-thread)."""

def cuda_copy_to_host(device: int, dst: int, src: int, length: int) -> None: ...
def cuda_copy_to_device(device: int, dst: int, src: int, length: int) -> None: ...
def dlpack_capsule(
    owner: object,
    ptr: int,
    device_type: int,
    device_id: int,
    shape: list[int],
    code: int,
    bits: int,
) -> Any:
    """A "dltensor" capsule (compact row-major) that keeps ``owner`` alive until consumed."""

def read_file_ranges(
    fd: int,
    path: str,
    file_size: int,
    direct: list[tuple[int, int, int]],
    copied: list[tuple[int, int, int, bool]],
    align: int = 4096,
    chunk: int = 4194304,
    depth: int = 16,
    timeout_s: float = 60.0,
    use_uring: bool = True,
    copier: DeviceCopier | None = None,
    prefault: bool = True,
) -> dict[str, Any]:
    """Reads byte ranges of the open file ``fd`` (csrc/transport/storage/file_reader.h):
    ``direct`` [(file_offset, length, address)] straight into aligned host memory, ``copied``
    [(file_offset, length, address, on_device)] through bounce buffers; ``prefault``: the
    direct ranges' pages faulted in ahead of the reads on a second thread. Returns
    {"bytes_read", "reads", "copies", "engine"}."""

def gds_unavailable() -> str:
    """ "" when GPUDirect Storage (libcufile) can be used here, else why not."""

def gds_status() -> dict[str, str]:
    """What loading libcufile (GPUDirect Storage) found: {"library": the name tried, "path":
    the file loaded ("" when none), "version" ("" when unknown), "unavailable": why GDS cannot
    be used ("" when it can)}."""

def read_file_gds(
    fd: int,
    path: str,
    file_size: int,
    device: int,
    ranges: list[tuple[int, int, int]],
    chunk: int = 16777216,
) -> dict[str, Any]:
    """[(file_offset, length, device_address)] of the O_DIRECT file ``fd`` into GPU memory
    by cuFileRead. Returns {"bytes_read", "reads", "copies", "engine": "cufile"}."""

class DeviceMemory:
    """cuMemAlloc'd device memory, freed with the object."""

    def __init__(self, device: int, length: int) -> None: ...
    @property
    def ptr(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def device(self) -> int: ...

class PinnedHostMemory:
    """cuMemHostAlloc'd page-locked host memory (what bounce buffers are made of)."""

    def __init__(self, device: int, length: int) -> None: ...
    @property
    def ptr(self) -> int: ...
    @property
    def length(self) -> int: ...

class DeviceCopier:
    def describe(self) -> str: ...

class HostCopier(DeviceCopier):
    """Host memory standing in for the device (memcpy on a worker thread), with faults for
    tests: a delay per copy (microseconds), the copy numbered ``fail_at`` fails, the copy
    numbered ``hang_at`` never completes."""

    def __init__(self, delay_us: int = 0, fail_at: int = -1, hang_at: int = -1) -> None: ...
    @property
    def copies_started(self) -> int: ...

class CudaCopier(DeviceCopier):
    def __init__(self, device: int) -> None: ...

class Stager:
    """The staging pipeline (csrc/protocol/staging.h): device memory through the engine's
    bounce pool (csrc/transport/bounce_pool.h), copies overlapped with the wire, run by at most
    8 worker threads. Each post_* returns at once; its Request completes when the bytes are in
    place. ``chunk_size`` in bytes (0: 8 MiB; at most a slab), ``slots`` bounce slabs (0: 3, at
    most 8), ``timeout`` in seconds without progress (waiting for slabs included). A message
    longer than a chunk moves in windows of at most a chunk (csrc/protocol/message_windows.h),
    through at most ``slots`` slabs at each end whatever its size."""

    def __init__(self, engine: Engine, copier: DeviceCopier) -> None: ...
    def post_write(
        self,
        endpoint: Endpoint,
        device: int,
        length: int,
        remote: Descriptor,
        remote_offset: int = 0,
        chunk_size: int = 0,
        slots: int = 0,
        timeout: float = 60.0,
        streams: int = 0,
    ) -> Request: ...
    def post_read(
        self,
        endpoint: Endpoint,
        device: int,
        length: int,
        remote: Descriptor,
        remote_offset: int = 0,
        chunk_size: int = 0,
        slots: int = 0,
        timeout: float = 60.0,
        streams: int = 0,
    ) -> Request: ...
    def post_send(
        self,
        endpoint: Endpoint,
        device: int,
        length: int,
        meta: builtins.bytes,
        timeout: float = 60.0,
        streams: int = 0,
        chunk_size: int = 0,
        slots: int = 0,
    ) -> Request: ...
    def post_recv(
        self,
        endpoint: Endpoint,
        msg_id: int,
        device: int,
        length: int,
        timeout: float = 60.0,
        chunk_size: int = 0,
        slots: int = 0,
    ) -> Request: ...
    def post_send_direct(
        self,
        endpoint: Endpoint,
        region: Region,
        offset: int,
        length: int,
        meta: builtins.bytes,
        streams: int = 0,
        chunk_size: int = 0,
    ) -> Request: ...
    def post_recv_direct(
        self,
        endpoint: Endpoint,
        msg_id: int,
        region: Region,
        offset: int,
        length: int,
        timeout: float = 60.0,
    ) -> Request: ...
    def pool_stats(self) -> dict[str, int]: ...
    def stats(self) -> dict[str, int]: ...
    @property
    def active(self) -> int: ...
    @property
    def workers(self) -> int: ...
    def describe(self) -> str: ...
    def close(self) -> None: ...

# -- batches and notifications (csrc/bindings/batch_bindings.cc) ---------------------------------

class BatchPlan:
    """Entries validated, zero-length ones skipped, contiguous neighbours merged (protocol/batch.h).

    ``table``: uint64 array of shape (N, 5): region index, local offset, descriptor index, remote
    offset, length (bytes)."""

    def __init__(
        self,
        op: str,
        regions: list[Region],
        remotes: list[Descriptor],
        table: npt.NDArray[np.uint64],
        chunk_size: int = 0,
        streams: int = 0,
    ) -> None: ...
    @property
    def entries(self) -> int: ...
    @property
    def operations(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def skipped(self) -> int:
        """Zero-length entries."""
    def invalid(self) -> list[tuple[int, str, str]]:
        """(entry, rdmaxfer.errors class name, reason) for entries refused at planning."""

class BatchRun:
    """One posting of a BatchPlan; ``request`` is terminal once every operation is."""

    @property
    def request(self) -> Request: ...
    @property
    def window(self) -> int: ...
    @property
    def operations(self) -> int: ...
    @property
    def peak_outstanding(self) -> int: ...
    @property
    def notified(self) -> bool: ...
    @property
    def bytes_done(self) -> int: ...
    def failures(self) -> list[tuple[int, str, str]]:
        """(entry, rdmaxfer.errors class name, reason) per failed entry, in entry order."""

def batch_table(
    entries: Iterable[object],
    region_type: type,
    slow: Callable[[int, object], tuple[Any, int, int, object, int]],
    descriptor_of: Callable[[object], Descriptor],
) -> tuple[list[Any], list[Region], list[object], list[Descriptor], npt.NDArray[np.uint64]]:
    """A batch's entries as a BatchPlan table (csrc/bindings/batch_entries.cc): returns (region
    objects, their ``core``, remote objects, their descriptors, table (N, 5)), each object once
    by identity, in first-seen order. Entries ``((region, offset, nbytes), remote, offset)``
    with ``region`` exactly of ``region_type`` and plain ints >= 0 are read in C++; every other
    goes to ``slow(index, entry)``, which checks it (raising) and returns (region, offset,
    nbytes, remote, remote_offset)."""

def post_batch(
    endpoint: Endpoint,
    plan: BatchPlan,
    notify: builtins.bytes | int | None,
    window: int = 256,
    whole: bool = False,
) -> BatchRun: ...
def check_notify(notify: builtins.bytes | int | None) -> None:
    """Raise InvalidArgumentError unless notify is None, bytes (<= 64) or an int in 0..2**32-1."""

def pop_notification(engine: Engine, timeout: float) -> tuple[str, builtins.bytes | int] | None:
    """The oldest notification (peer, payload), or None after timeout seconds."""

def notification_fd(engine: Engine) -> int:
    """An eventfd readable while a notification waits."""

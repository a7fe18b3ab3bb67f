"""Type stubs for the C++ extension ``rdmaxfer._core`` (csrc/bindings/module.cc).

Lengths and offsets are in bytes; timeouts in seconds (finite). Every blocking call releases the
GIL. Errors are raised as the classes of :mod:`rdmaxfer.errors`.
"""

import builtins

ACCESS_LOCAL: int
ACCESS_REMOTE_READ: int
ACCESS_REMOTE_WRITE: int

def available_transports() -> dict[str, str]:
    """Transport name -> "" when usable here, else the reason it is not."""

def record_kinds() -> list[str]:
    """Wire records parse_record() knows ("descriptor", "hello", "frame", ...)."""

def parse_record(kind: str, data: bytes) -> str:
    """Parse ``data`` as the wire record ``kind`` (for fuzzing and tests); a summary of what
    was accepted, or ProtocolError."""

def memlock_limit() -> str:
    """The RLIMIT_MEMLOCK soft limit as ``ulimit -l`` prints it ("unlimited" or "N KiB")."""

class Descriptor:
    """Names a registered region for a peer: 40-byte versioned little-endian record."""

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
    def access(self) -> int: ...
    @property
    def pinned(self) -> bool: ...
    @property
    def registered(self) -> bool: ...
    def descriptor(self) -> Descriptor: ...

class Request:
    """A posted operation. Terminal once done() is True; check() raises its error."""

    @property
    def id(self) -> int: ...
    @property
    def op(self) -> str: ...
    @property
    def bytes(self) -> int: ...
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
    def streams(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def error(self) -> str: ...
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
    def post_recv_header(self) -> Request: ...
    def post_recv(self, msg_id: int, local: Region, offset: int, length: int) -> Request: ...
    def reject(self, msg_id: int, reason: str) -> None: ...
    def cancel_recv_header(self, request: Request) -> bool: ...
    def close(self) -> None: ...
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
    ) -> None:
        """``transport``: "tcp" or "rdma". ``default_streams``: TCP streams or RC QPs per
        connection (0: 4 on TCP, 1 on rdma). ``secret``: shared secret for the bootstrap's
        HMAC-SHA256 challenge-response ("" = none; see csrc/transport/auth.h).

        rdma only: ``rdma_device`` ("" -> env RDMAXFER_RDMA_DEVICE -> the first device with an
        active port); ``gid_index`` (-1 -> env RDMAXFER_GID_INDEX -> auto: the first RoCE v2 GID
        holding an IPv4-mapped address); ``poll_mode`` ("event", the default, sleeps on the
        completion channel; "busy" spins on the CQ; "" -> env RDMAXFER_POLL_MODE -> "event").
        """
    @property
    def transport(self) -> str: ...
    @property
    def engine_id(self) -> int: ...
    @property
    def notify_fd(self) -> int: ...
    def capabilities(self) -> dict[str, int | bool | str]: ...
    def describe(self) -> str: ...
    def listen(self, host: str, port: int) -> int: ...
    def accept(self, timeout: float) -> Endpoint: ...
    def connect(self, host: str, port: int, streams: int, timeout: float) -> Endpoint: ...
    def register(self, addr: int, length: int, access: int) -> Region: ...
    def alloc_pinned(self, length: int, access: int) -> Region: ...
    def deregister(self, region: Region, timeout: float) -> None: ...
    def drain_notifications(self) -> list[int]: ...
    def registered_count(self) -> int: ...
    def close(self) -> None: ...

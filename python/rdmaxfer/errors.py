"""Exceptions raised by rdmaxfer.

Every error derives from :class:`RdmaxferError`. Errors raised by the C++ core are turned into
these classes in exactly one place (``csrc/bindings/errors.cc``); each message names the value
that failed and the fix. Classes also derive from the matching built-in exception so that
``except TimeoutError`` or ``except ValueError`` keep working.
"""

from __future__ import annotations

import builtins
from typing import NamedTuple

__all__ = [
    "ChecksumError",
    "ConnectionFailedError",
    "CorruptFileError",
    "EndpointClosedError",
    "FetchError",
    "FetchIntegrityError",
    "InvalidArgumentError",
    "ProtocolError",
    "RdmaxferError",
    "RegistrationError",
    "RemoteAccessError",
    "TransferTimeoutError",
    "TransportError",
    "UnsupportedError",
    "WcStatus",
]


class WcStatus(NamedTuple):
    """The status of a failed verbs work completion: ``ibv_wc_status`` number and name
    (``WcStatus(10, "IBV_WC_REM_ACCESS_ERR")``)."""

    number: int
    name: str


class RdmaxferError(Exception):
    """Base class of every rdmaxfer error.

    Errors from the C++ core keep their cause as attributes (and in the message):

    Attributes:
        errno: the OS or verbs errno of the failed call (``ibv_reg_mr``, ``connect``...), or
            None.
        wc_status: for a failed verbs work completion, its :class:`WcStatus` (number and
            name), else None.
        vendor_err: the completion's ``vendor_err`` (device-specific), or None.
    """

    errno: int | None = None
    wc_status: WcStatus | None = None
    vendor_err: int | None = None


class InvalidArgumentError(RdmaxferError, ValueError):
    """A value passed by the caller cannot work (non-contiguous array, dtype/shape mismatch,
    size out of range...). Nothing was sent or written."""


class ConnectionFailedError(RdmaxferError, builtins.ConnectionError):
    """The peer could not be reached, refused the handshake, or closed/reset the connection.
    The endpoint is closed; the engine stays usable and can connect or accept again."""


class EndpointClosedError(ConnectionFailedError):
    """The endpoint (or its engine) was closed locally before or during the operation."""


class TransferTimeoutError(RdmaxferError, builtins.TimeoutError):
    """A bounded wait ran out (connect, accept, transfer or receive). A transfer that timed out
    closes its endpoint, since the stream can no longer be trusted; the engine stays usable."""


class RegistrationError(RdmaxferError):
    """Memory could not be registered or pinned (memlock limit, size, unsupported memory)."""


class ProtocolError(RdmaxferError):
    """A malformed, unsupported or refused record: bad descriptor bytes, a peer of another
    version, or a message the receiver rejected."""


class ChecksumError(ProtocolError):
    """The bytes of a message do not match the XXH3-64 checksum its sender computed
    (``send(..., checksum=True)``): they were corrupted on the way."""


class RemoteAccessError(RdmaxferError):
    """The peer refused a one-sided READ/WRITE: unknown or dead key, range outside the
    registered region, or access not allowed (the TCP twin of IBV_WC_REM_ACCESS_ERR)."""


class UnsupportedError(RdmaxferError):
    """The transport or feature is not available on this machine; the message says why."""


class TransportError(RdmaxferError):
    """A system or verbs call failed; the message names the call and its errno text."""


class CorruptFileError(InvalidArgumentError):
    """A weights file is truncated or its header is corrupt; the message names the file, the
    tensor and the byte offset. Nothing was returned.

    Attributes:
        path: the file.
        tensor: the tensor whose bytes or header entry is bad, or None (the header itself).
        offset: the byte offset in the file where the problem is.
    """

    def __init__(self, message: str, path: str, tensor: str | None, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.tensor = tensor
        self.offset = offset


class FetchError(RdmaxferError):
    """An HTTP download (``rdmaxfer.fetch``) failed: an HTTP error status, a range that kept
    failing after its retries, a file that changed on the server, or not a safetensors file."""


class FetchIntegrityError(FetchError):
    """Downloaded bytes do not match the expected size or SHA-256."""

"""TLS settings of an engine: :class:`~rdmaxfer.options.TcpOptions` ``tls``, ``tls_cert``,
``tls_key``, ``tls_ca`` (or ``Engine(tls=True)``, ``RDMAXFER_TLS``...) resolved into the text
settings (``<transport>.tls``...) that the core parses (csrc/transport/tls.h) for every
transport that declares the ``tls`` capability.

TLS 1.3, authenticated by the shared secret as an external pre-shared key (RFC 8446 4.2.11) or
by certificates, covers every stream of a tcp connection, and the bootstrap stream of an rdma
or ofi connection with everything sent over it (the endpoint records with QP numbers, GIDs
and addresses; ofi's control messages); the bytes on the RDMA fabric stay as they are. The
shm transport, which never leaves the host, does not run under it (the security page says
what each protects).
"""

from __future__ import annotations

from typing import Any

from .._transports import capabilities, listed
from ..errors import InvalidArgumentError, UnsupportedError
from ..options import TCP, env_setting

__all__ = ["TLS_ARGS", "TLS_ROW", "tls_settings"]

#: ``_core.Engine`` keywords this module resolves, by TcpOptions field (None: not given).
TLS_ARGS = {"tls": "RDMAXFER_TLS", "tls_cert": "RDMAXFER_TLS_CERT", "tls_key": "RDMAXFER_TLS_KEY",
            "tls_ca": "RDMAXFER_TLS_CA"}  # fmt: skip
#: The row of ``tls`` (checks ``Engine(tls=...)``).
TLS_ROW = next(o for o in TCP if o.name == "tls")


def tls_settings(core_args: dict[str, Any], kind: str, network: str) -> bool:
    """Moves the TLS fields out of ``core_args`` (each None when not given: its variable, else
    its default) into ``core_args["settings"]`` as ``<name>.tls`` ("0"/"1"),
    ``<name>.tls_cert``, ``<name>.tls_key``, ``<name>.tls_ca`` for every transport that
    declares the ``tls`` capability; returns whether TLS is on. ``kind``: the engine's
    transport ("auto", "tcp", "rdma", "shm", ...); ``network``: the network transport it uses.

    Raises:
        UnsupportedError: TLS asked for on an engine whose network transport cannot run under
            it (shm).
        InvalidArgumentError: a variable holds an invalid value, or a certificate file is
            given (argument or variable) while TLS is off.
    """
    values = {}
    for name, env in TLS_ARGS.items():
        value = core_args.pop(name)
        values[name] = env_setting(env) if value is None else value
    on = bool(values["tls"])
    files = [name for name in ("tls_cert", "tls_key", "tls_ca") if values[name]]
    if files and not on:
        # Certificates authenticate only under TLS: without it none would be checked.
        given = ", ".join(f"{name}={values[name]!r}" for name in files)
        raise InvalidArgumentError(
            f"{given} set but TLS is off, so no certificate would be checked: turn TLS on "
            "(tls=True / RDMAXFER_TLS=1), or drop tls_cert, tls_key and tls_ca "
            "(RDMAXFER_TLS_CERT, RDMAXFER_TLS_KEY, RDMAXFER_TLS_CA)"
        )
    covered = [name for name in listed() if capabilities(name).tls]
    if on and network not in covered:
        raise UnsupportedError(
            f"tls=True: TLS covers the {', '.join(covered)} transports only, and this engine "
            f"uses {network!r}"
            f"{' (transport=auto picked it)' if kind == 'auto' else ''}; make the engine with "
            "transport='tcp', or turn tls off (RDMAXFER_TLS=0) and rely on the shared secret"
        )
    settings = core_args.setdefault("settings", {})
    for transport in covered:
        settings[f"{transport}.tls"] = "1" if on else "0"
        for name in ("tls_cert", "tls_key", "tls_ca"):
            settings[f"{transport}.{name}"] = values[name] or ""
    return on

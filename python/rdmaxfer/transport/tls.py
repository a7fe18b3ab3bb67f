"""TLS settings of an engine: :class:`~rdmaxfer.options.TcpOptions` ``tls``, ``tls_cert``,
``tls_key``, ``tls_ca`` (or ``Engine(tls=True)``, ``RDMAXFER_TLS``...) resolved into the tcp
transport's own text settings (``tcp.tls``...) that the core parses (csrc/transport/tls.h).

TLS 1.3 covers the tcp transport: every stream of every connection, authenticated by the
shared secret as an external pre-shared key (RFC 8446 4.2.11) or by certificates. The shm
and rdma transports do not run under it (the security page says what each protects).
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError
from ..options import TABLES, TCP, env_setting

__all__ = ["TLS_ARGS", "TLS_ROW", "tls_settings"]

#: ``_core.Engine`` keywords this module resolves, by TcpOptions field (None: not given).
TLS_ARGS = {"tls": "RDMAXFER_TLS", "tls_cert": "RDMAXFER_TLS_CERT", "tls_key": "RDMAXFER_TLS_KEY",
            "tls_ca": "RDMAXFER_TLS_CA"}  # fmt: skip
#: The row of ``tls`` (checks ``Engine(tls=...)``).
TLS_ROW = next(o for o in TCP if o.name == "tls")


def tls_settings(core_args: dict[str, Any], kind: str, network: str) -> bool:
    """Moves the TLS fields out of ``core_args`` (each None when not given: its variable, else
    its default) into ``core_args["settings"]`` as ``tcp.tls`` ("0"/"1"), ``tcp.tls_cert``,
    ``tcp.tls_key``, ``tcp.tls_ca``; returns whether TLS is on. ``kind``: the engine's
    transport ("auto", "tcp", "rdma", "shm"); ``network``: the network transport it uses.

    Raises:
        UnsupportedError: TLS asked for on an engine whose network transport is not tcp.
        InvalidArgumentError: a variable holds an invalid value.
    """
    values = {}
    for name, env in TLS_ARGS.items():
        value = core_args.pop(name)
        values[name] = env_setting(env) if value is None else value
    on = bool(values["tls"])
    # TLS runs on the transports whose settings table declares it (the tcp transport's).
    covered = [name for name, rows in TABLES.items() if TLS_ROW in rows]
    if on and network not in covered:
        raise UnsupportedError(
            f"tls=True: TLS covers the {' and '.join(covered)} transport only, and this engine "
            f"uses {network!r}"
            f"{' (transport=auto picked it)' if kind == 'auto' else ''}; make the engine with "
            "transport='tcp', or turn tls off (RDMAXFER_TLS=0) and rely on the shared secret"
        )
    settings = core_args.setdefault("settings", {})
    settings["tcp.tls"] = "1" if on else "0"
    for name in ("tls_cert", "tls_key", "tls_ca"):
        settings[f"tcp.{name}"] = values[name] or ""
    return on

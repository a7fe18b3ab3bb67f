"""Runs an example's two sides: both on this machine (one in a child process), or the one
``--role`` names, for two machines."""

import argparse
import multiprocessing
from collections.abc import Callable
from typing import Any


def run_both(child: Callable[..., None], here: Callable[..., None], *args: Any) -> None:
    """``child(*args)`` in a new process while ``here(*args)`` runs in this one.

    Exits with an error when the child fails or is still running 60 s after ``here`` ends.
    """
    peer = multiprocessing.get_context("spawn").Process(target=child, args=args)
    peer.start()
    try:
        here(*args)
    finally:
        peer.join(60)
        if peer.exitcode is None:
            peer.kill()
            peer.join()
    if peer.exitcode != 0:
        raise SystemExit(f"the other side ({child.__name__}) failed: exit code {peer.exitcode}")


def main(
    description: str, listener: Callable[[str, int], None], connector: Callable[[str, int], None]
) -> None:
    """The command line of an example whose sides are ``listener(host, port)`` (it listens on
    ``host``) and ``connector(host, port)`` (it connects to ``host``): ``--role`` is the name of
    one of them, or ``both`` (the default: both on this machine, over loopback)."""
    roles = {listener.__name__: listener, connector.__name__: connector}
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--role", choices=["both", *roles], default="both")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help=f"{listener.__name__}: the address to listen on (0.0.0.0: every interface); "
        f"{connector.__name__}: the address of the {listener.__name__} side",
    )
    parser.add_argument("--port", type=int, default=5555)
    args = parser.parse_args()
    if args.role == "both":
        run_both(listener, connector, args.host, args.port)
    else:
        roles[args.role](args.host, args.port)

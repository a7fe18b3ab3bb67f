"""Free TCP ports for servers a test starts in another process (nginx, torch's TCPStore, the
examples), chosen below the kernel's ephemeral range: a port there is never handed to another
process's outgoing connection or ``bind(0)`` between our check and the server's ``bind``."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_floor() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(count: int = 1) -> int:
    """A port P with P .. P + count - 1 all bindable on 127.0.0.1 now, from 10000 up to the
    ephemeral range's floor; raises RuntimeError after 200 tries."""
    top = _ephemeral_floor() - count
    for _ in range(200):
        port = random.randrange(10000, top)
        if all(_bindable(port + i) for i in range(count)):
            return port
    raise RuntimeError(f"no {count} neighbouring free ports between 10000 and {top + count}")

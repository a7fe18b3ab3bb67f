"""Ctrl-C ends every blocking wait of the package (TCP): accept (module-level recv/send with
listen=, Engine.accept), connect (a refused peer being retried), a handshake with a peer that
never answers, send, recv, read, write and pull_weights. A child process blocks in each wait; on
SIGINT it must raise KeyboardInterrupt within 0.5 s and exit with a normal traceback (before,
it waited out its timeout and died with 'lost sys.stderr'). The verbs twin is
tests/rdma/test_rdma_interrupt.py."""

from __future__ import annotations

import pytest

from _interrupts import (
    check_prompt,
    child_env,
    interrupt,
    refused_address,
    server,
    silent_listener,
)

ENV = child_env(RDMAXFER_TRANSPORT="tcp")


@pytest.mark.parametrize("kind", ["accept-recv", "accept-send", "accept-engine"])
def test_ctrl_c_while_accepting(kind: str) -> None:
    check_prompt(interrupt(kind, "-", ENV))


def test_ctrl_c_while_connecting_to_a_peer_not_listening_yet() -> None:
    check_prompt(interrupt("connect-refused", refused_address(), ENV))


def test_ctrl_c_in_a_handshake_the_peer_never_answers() -> None:
    with silent_listener() as address:
        check_prompt(interrupt("handshake", address, ENV))


@pytest.mark.parametrize("kind", ["send", "recv", "read", "write"])
def test_ctrl_c_in_a_transfer(kind: str) -> None:
    with server("serve", "127.0.0.1", ENV) as (peer, address):
        check_prompt(interrupt(kind, address, ENV, before=peer.pause))


def test_ctrl_c_in_pull_weights() -> None:
    with server("serve-weights", "127.0.0.1", ENV) as (peer, address):
        check_prompt(interrupt("pull", address, ENV, before=peer.pause))

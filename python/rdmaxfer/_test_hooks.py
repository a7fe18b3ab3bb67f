"""The switches of the project's own tests, in one place: not settings (nobody should set them
outside the tests), and not read anywhere else in the package.

Read here (Python), set by the rxe test guest (``tests/rxe/run-in-vm.sh``) for the tests and for
``rdmaxfer bench`` run inside it:

* ``RDMAXFER_RXE_DEVICES``: the guest's soft-RoCE devices, this side then the peer's (``"rxe0
  rxe1"``).
* ``RDMAXFER_RXE_ADDRS``: their IPv4 addresses, in the same order.
* ``RDMAXFER_RXE_RAIL_DEVICES``: with ``--rails N``, each side's devices (``"rxe0,rxe2
  rxe1,rxe3"``).

Read by the core's fault injection, only in ``csrc/common/test_hooks.h`` (the shipped transports
ask that header, never the environment):

* ``RDMAXFER_RDMA_TEST_QP_ERR`` (``DEVICE:BYTES``): once the rail on that device has carried that
  many bytes of one-sided chunks, the QP whose completion crossed it is moved to ERR.
* ``RDMAXFER_OFI_TEST_RAIL_ERR`` (``DOMAIN:BYTES``): on each ofi endpoint, once the rail on that
  domain has carried that many bytes of one-sided parts, the part whose completion crossed it
  reports a failure.
* ``RDMAXFER_OFI_TEST_LOST_READ`` (``DOMAIN:BYTES``): the same for a READ part, reported done
  with its bytes zeroed, and the rail fails right after.
* ``RDMAXFER_OFI_TEST_REJOIN_S`` (seconds): how long an ofi endpoint waits before it first asks
  a failed rail back (default 1).
* ``RDMAXFER_RDMA_TEST_CTRL_TWICE`` (``1``): every control SEND is posted twice.
* ``RDMAXFER_LOOPBACK_SWAP_CTS`` (``1``): the loopback transport holds the first windowed CTS of
  each message back and sends it after the next one.

The stand-in CUDA driver of the tests (``tests/cuda_standin``, not part of the package) reads its
own ``RDMAXFER_CUDA_STANDIN_*`` switches.
"""

from __future__ import annotations

import os

__all__ = ["TEST_HOOKS", "rxe_guest"]

#: Every tests-only variable of the package: name -> what it does (``rdmaxfer info --config``).
TEST_HOOKS: dict[str, str] = {
    "RDMAXFER_RXE_DEVICES": "the rxe guest's devices, this side then the peer's",
    "RDMAXFER_RXE_ADDRS": "the rxe guest devices' IPv4 addresses, in the same order",
    "RDMAXFER_RXE_RAIL_DEVICES": "each side's devices with --rails N ('rxe0,rxe2 rxe1,rxe3')",
    "RDMAXFER_RDMA_TEST_QP_ERR": "DEVICE:BYTES: move a QP on that rail to ERR after BYTES",
    "RDMAXFER_OFI_TEST_RAIL_ERR": "DOMAIN:BYTES: fail an ofi part on that rail after BYTES",
    "RDMAXFER_OFI_TEST_LOST_READ": "DOMAIN:BYTES: zero an ofi READ part's bytes, fail its rail",
    "RDMAXFER_OFI_TEST_REJOIN_S": "SECONDS: an ofi endpoint's first wait to ask a rail back",
    "RDMAXFER_RDMA_TEST_CTRL_TWICE": "1: post every rdma control SEND twice",
    "RDMAXFER_LOOPBACK_SWAP_CTS": "1: loopback sends each message's first windowed CTS late",
}


def rxe_guest() -> tuple[list[str], list[str], list[list[str]]]:
    """The rxe guest's (devices, addresses, rail devices per side), each empty outside it."""
    devices = os.environ.get("RDMAXFER_RXE_DEVICES", "").split()
    addrs = os.environ.get("RDMAXFER_RXE_ADDRS", "").split()
    sides = [s.split(",") for s in os.environ.get("RDMAXFER_RXE_RAIL_DEVICES", "").split()]
    return devices, addrs, sides

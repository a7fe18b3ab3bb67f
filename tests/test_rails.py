"""Rails on the host: the multi-rail descriptor (version 2: an rkey per extra rail), the
``rdma_devices=`` argument, and the endpoint record's rail list. Striping and failover need
verbs devices: tests/rdma/test_rdma_rails.py, in the guest with ``--rails 2``."""

from __future__ import annotations

import struct

import pytest

from _peers import make_array
from rdmaxfer import Engine, InvalidArgumentError, ProtocolError, _core


def _multi_rail(packed: bytes, keys: list[int]) -> bytes:
    """A version-1 descriptor turned into the version 2 a multi-rail rdma engine sends."""
    head = bytearray(packed)
    head[4:6] = struct.pack("<H", 2)
    head[28] = len(keys)
    return bytes(head) + b"".join(struct.pack("<I", k) for k in keys)


def test_descriptor_carries_a_key_per_rail() -> None:
    with Engine("tcp") as engine:
        region = engine.register(make_array(3, 4096), "rw")
        one = region.descriptor()
        assert one.rail_keys == [] and len(one.pack()) == _core.Descriptor.SIZE
        packed = _multi_rail(one.pack(), [0x1234, 0xABCDEF])
        d = _core.Descriptor.unpack(packed)
        assert d.rail_keys == [0x1234, 0xABCDEF] and d.key == one.key
        assert (d.addr, d.length) == (one.addr, one.length)
        assert d.pack() == packed and len(packed) == _core.Descriptor.SIZE + 8


def test_descriptor_carries_its_generation() -> None:
    """Bytes 29-30 of a multi-rail descriptor: how many devices of the registering engine had
    come back (a peer uses a rail's key only from a descriptor as new as that rail's return)."""
    with Engine("tcp") as engine:
        packed = engine.register(make_array(5, 64), "r").descriptor().pack()
    assert _core.Descriptor.unpack(packed).generation == 0
    two = bytearray(_multi_rail(packed, [0x51]))
    two[29:31] = struct.pack("<H", 0x1203)
    d = _core.Descriptor.unpack(bytes(two))
    assert d.generation == 0x1203 and d.rail_keys == [0x51]
    assert d.pack() == bytes(two)
    with pytest.raises(ProtocolError, match=r"reserved field is not zero"):
        _core.Descriptor.unpack(packed[:29] + b"\x02" + packed[30:])
    with pytest.raises(ProtocolError, match=r"reserved field is not zero"):
        _core.Descriptor.unpack(bytes(two[:31]) + b"\x01" + bytes(two[32:]))


def test_multi_rail_descriptor_refuses_bad_bytes() -> None:
    with Engine("tcp") as engine:
        packed = engine.register(make_array(4, 64), "r").descriptor().pack()
    with pytest.raises(ProtocolError, match=r"expected 48 bytes, got 44"):
        _core.Descriptor.unpack(_multi_rail(packed, [7, 8])[:-4])
    with pytest.raises(ProtocolError, match=r"version 2 without rail keys"):
        _core.Descriptor.unpack(_multi_rail(packed, []))
    with pytest.raises(ProtocolError, match=r"rail key 0 is never assigned"):
        _core.Descriptor.unpack(_multi_rail(packed, [9, 0]))
    with pytest.raises(ProtocolError, match=r"reserved field is not zero"):
        _core.Descriptor.unpack(packed[:28] + b"\x01" + packed[29:])


@pytest.mark.parametrize("bad", [[], [""], ["rxe0", 3]])
def test_rdma_devices_must_name_devices(bad: list[object]) -> None:
    with pytest.raises(InvalidArgumentError, match=r"rdma_devices=.*give device names"):
        Engine("rdma", rdma_devices=bad)  # type: ignore[arg-type]


def test_engines_without_rails_list_none() -> None:
    with Engine("tcp") as engine:
        assert engine.core.rails() == []


def test_endpoint_record_with_two_rails_parses() -> None:
    """Version-2 record: 64-byte header (rail 0, its generation at 46), 8 bytes per QP (its rail
    in the QPN's top byte, the peer's in the PSN's), then 32 bytes per further rail (its
    generation at 12)."""
    gid0 = bytes(10) + b"\xff\xff" + bytes([10, 77, 0, 1])
    gid1 = bytes(10) + b"\xff\xff" + bytes([10, 78, 0, 1])
    head = struct.pack(
        "<4sHBBHBBBBBB16sIIIBBHQII",
        b"RXEP", 2, 2, 2, 0, 5, 1, 1, 1, 24, 0, gid0, 1 << 30, 16384, 32, 16, 16, 3, 7, 25000, 0,
    )  # fmt: skip
    qps = struct.pack("<II", 0x11 | 0 << 24, 0x22 | 0xFF << 24)
    qps += struct.pack("<II", 0x33 | 1 << 24, 0x44 | 0xFF << 24)
    rail1 = struct.pack("<BBBBHBxIHH16s", 2, 5, 1, 1, 0, 24, 25000, 4, 0, gid1)
    assert _core.parse_record("endpoint_record", head + qps + rail1) == "endpoint_record qps=2"
    with pytest.raises(ProtocolError, match=r"does not match its counts"):
        _core.parse_record("endpoint_record", head + qps)
    reserved = struct.pack("<BBBBHBxIHH16s", 2, 5, 1, 1, 0, 24, 25000, 4, 1, gid1)
    with pytest.raises(ProtocolError, match=r"reserved bytes are not zero"):
        _core.parse_record("endpoint_record", head + qps + reserved)
    bad_rail = struct.pack("<II", 0x33 | 2 << 24, 0x44)
    with pytest.raises(ProtocolError, match=r"QP on rail 2 of 2"):
        _core.parse_record("endpoint_record", head + qps[:8] + bad_rail + rail1)

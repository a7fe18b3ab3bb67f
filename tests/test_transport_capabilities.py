"""Transports are chosen by what they declare (csrc/transport/registry.h, rdmaxfer._transports),
never by name: the registry lists each transport's capabilities, automatic selection and the
same-host companion follow them, and no code outside the registry compares a transport's
name or switches on a transport kind (a grep over csrc/ and python/ guards it)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import rdmaxfer
from rdmaxfer import _core, _transports
from rdmaxfer.errors import InvalidArgumentError, ProtocolError

ROOT = Path(__file__).resolve().parent.parent

#: Where a transport may be named in a decision: the registry, which holds the entries.
REGISTRY = (
    "csrc/transport/registry.h",
    "csrc/transport/registry.cc",
    "python/rdmaxfer/_transports.py",
)


def test_every_transport_declares_its_capabilities() -> None:
    table = _core.transports()
    assert {"tcp", "shm", "rdma", "loopback"} <= set(table)
    ids = [caps["wire_id"] for caps in table.values()]
    assert len(set(ids)) == len(ids) and 0 not in ids
    for name, caps in table.items():
        assert caps["name"] == name
        assert isinstance(caps["unavailable"], str)
        assert _transports.capabilities(name).wire_id == caps["wire_id"]
    assert table["tcp"]["network"] and table["tcp"]["auto_rank"] > 0
    assert table["rdma"]["gpu_direct"] and table["rdma"]["rails"]
    assert table["rdma"]["auto_rank"] > table["tcp"]["auto_rank"]
    assert table["shm"]["same_host_companion"] and table["shm"]["device_ipc"]
    assert not table["shm"]["network"] and table["shm"]["auto_rank"] == 0
    assert not table["loopback"]["listed"]
    listed = {n for n, c in table.items() if c["listed"]}
    assert set(_core.available_transports()) == listed
    assert _transports.listed() == tuple(sorted(listed))


def test_auto_picks_the_usable_network_transport_of_highest_rank() -> None:
    """Each network transport ranked above the one auto took was refused, and says why (ofi:
    also when libfabric loads but offers no hardware RDMA provider; test_auto_rule.py)."""
    table = _core.transports()
    name = _core.automatic_network_transport()
    assert (
        table[name]["network"] and table[name]["auto_rank"] > 0 and not table[name]["unavailable"]
    )
    above = [
        n for n, c in table.items() if c["network"] and c["auto_rank"] > table[name]["auto_rank"]
    ]
    with rdmaxfer.Engine("auto") as engine:
        assert engine.core.auto_why.startswith(f"{name}: "), engine.core.auto_why
        for n in above:
            assert f"{n} not usable (" in engine.core.auto_why, engine.core.auto_why
    assert _transports.same_host_companion() == "shm"


def test_unknown_transport_names_the_registered_ones() -> None:
    with pytest.raises(InvalidArgumentError, match=r"'rdma', 'shm', 'tcp'"):
        _transports.capabilities("carrier-pigeon")
    with pytest.raises(InvalidArgumentError, match=r"'rdma', 'shm', 'tcp', or 'auto'"):
        _core.Engine("carrier-pigeon")
    with pytest.raises(InvalidArgumentError, match="internal"):
        rdmaxfer.Engine("loopback")


def test_descriptor_carries_the_wire_id_and_unknown_ids_are_refused() -> None:
    with rdmaxfer.Engine("tcp") as engine:
        region = engine.register(np.zeros(64, np.uint8))
        packed = region.descriptor().pack()
        assert region.descriptor().transport == "tcp"
        assert packed[6] == _core.transports()["tcp"]["wire_id"]
    taken = {c["wire_id"] for c in _core.transports().values()}
    free = next(i for i in range(1, 256) if i not in taken)
    forged = packed[:6] + bytes([free]) + packed[7:]
    with pytest.raises(ProtocolError, match=f"unknown transport {free}"):
        _core.Descriptor.unpack(forged)


def _names() -> str:
    return "|".join(re.escape(n) for n in sorted(_core.transports()))


def _decisions_by_name(root: Path) -> list[str]:
    """Every line under ``root``'s csrc/ and python/ (outside the registry) that decides by a
    transport's name or kind."""
    quoted = rf"""["']({_names()})["']"""
    patterns = [
        re.compile(rf"(==|!=)\s*{quoted}"),
        re.compile(rf"{quoted}\s*(==|!=)"),
        re.compile(rf"\bin\s*[(\[{{]\s*{quoted}"),  # x in ("tcp", ...)
        re.compile(rf"\bcase\s+{quoted}"),
        re.compile(r"\bTransportKind\b"),
        re.compile(rf"available_transports\(\)\[\s*{quoted}"),
    ]
    sources = [*(root / "csrc").rglob("*"), *(root / "python").rglob("*.py")]
    found = []
    for path in sorted(sources):
        relative = path.relative_to(root).as_posix()
        if path.suffix not in (".h", ".cc", ".py") or not path.is_file() or relative in REGISTRY:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if any(p.search(line) for p in patterns):
                found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_no_decision_outside_the_registry_names_a_transport() -> None:
    assert _decisions_by_name(ROOT) == []


def test_the_grep_finds_planted_decisions_by_name(tmp_path: Path) -> None:
    (tmp_path / "python" / "rdmaxfer").mkdir(parents=True)
    (tmp_path / "csrc").mkdir()
    (tmp_path / "python" / "x.py").write_text('ok = 1\nrdma = kind == "rdma"\n')
    (tmp_path / "csrc" / "x.cc").write_text(
        'int a;\nif (caps.kind == TransportKind::kTcp) return;\nif ("shm" != name) {}\n'
    )
    (tmp_path / "python" / "rdmaxfer" / "_transports.py").write_text('x = name in ("tcp", "shm")\n')
    assert _decisions_by_name(tmp_path) == [
        "csrc/x.cc:2: if (caps.kind == TransportKind::kTcp) return;",
        'csrc/x.cc:3: if ("shm" != name) {}',
        'python/x.py:2: rdma = kind == "rdma"',
    ]

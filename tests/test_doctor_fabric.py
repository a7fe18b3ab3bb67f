"""``doctor``'s fabric check on fake sysfs trees: the traffic class against the NIC's PFC and
ECN priorities (rdmaxfer.tools.doctor_fabric)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmaxfer.tools.doctor_fabric import check_fabric


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """One RoCE port (mlx5_0 port 1 on eth0), nothing about PFC/ECN yet."""
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    write(port / "link_layer", "Ethernet")
    write(port / "gid_attrs/ndevs/1", "eth0")
    write(tmp_path / "class/net/eth0/mtu", "9000")
    return tmp_path


def lossless(sysfs: Path, prio: int, trust: str = "dscp") -> None:
    write(sysfs / "class/net/eth0/qos/trust", trust)
    write(sysfs / "class/net/eth0/qos/pfc", ",".join("1" if p == prio else "0" for p in range(8)))


def test_traffic_class_on_the_lossless_priority_is_ok(sysfs: Path) -> None:
    lossless(sysfs, 3)
    for p in range(8):
        write(sysfs / f"class/net/eth0/ecn/roce_np/enable/{p}", "1" if p == 3 else "0")
    [f] = check_fabric(sysfs, traffic_class=104, environ={})  # DSCP 26 -> priority 3
    assert (f.severity, f.subject) == ("ok", "mlx5_0 port 1 (eth0)")
    assert "traffic class 104: DSCP 26 -> priority 3" in f.message


def test_default_traffic_class_misses_pfc(sysfs: Path) -> None:
    lossless(sysfs, 3)
    [f] = check_fabric(sysfs, environ={})
    assert f.severity == "warn"
    assert "PFC is on for priority [3] but not 0" in f.message
    assert "traffic_class=96 (DSCP 24 -> priority 3)" in f.fix


def test_traffic_class_from_the_environment(sysfs: Path) -> None:
    lossless(sysfs, 3)
    [f] = check_fabric(sysfs, environ={"RDMAXFER_TRAFFIC_CLASS": "106"})
    assert f.severity == "ok" and "DSCP 26 -> priority 3" in f.message


def test_pcp_trust_uses_the_service_level(sysfs: Path) -> None:
    lossless(sysfs, 5, trust="pcp")
    [bad] = check_fabric(sysfs, traffic_class=104, service_level=3, environ={})
    assert bad.severity == "warn" and "service_level=5" in bad.fix
    [good] = check_fabric(sysfs, service_level=5, environ={})
    assert good.severity == "ok" and "service level 5 (PCP trust) -> priority 5" in good.message


def test_ecn_off_for_our_priority(sysfs: Path) -> None:
    lossless(sysfs, 3)
    write(sysfs / "class/net/eth0/ecn/roce_np/enable/3", "1")
    write(sysfs / "class/net/eth0/ecn/roce_rp/enable/3", "0")
    [f] = check_fabric(sysfs, traffic_class=104, environ={})
    assert f.severity == "warn" and "ECN (roce_rp) is off for priority 3" in f.message


def test_nic_forces_another_traffic_class(sysfs: Path) -> None:
    write(sysfs / "class/infiniband/mlx5_0/tc/1/traffic_class", "Global tclass=106")
    [f] = check_fabric(sysfs, traffic_class=104, environ={})
    assert f.severity == "warn" and "forces traffic class 106" in f.message


def test_nothing_in_sysfs_is_said(sysfs: Path) -> None:
    [f] = check_fabric(sysfs, environ={})
    assert f.severity == "info" and "sysfs shows no PFC/ECN setting for eth0" in f.message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"traffic_class": 256}, "256 is outside 0..255"),
        ({"environ": {"RDMAXFER_TRAFFIC_CLASS": "af41"}}, "RDMAXFER_TRAFFIC_CLASS='af41'"),
        ({"service_level": 16}, "16 is outside 0..15"),
    ],
)
def test_bad_settings_are_errors(sysfs: Path, kwargs: dict[str, object], message: str) -> None:
    kwargs.setdefault("environ", {})
    [f] = check_fabric(sysfs, **kwargs)  # type: ignore[arg-type]
    assert f.severity == "error" and message in f.message


def test_no_roce_port_no_finding(tmp_path: Path) -> None:
    assert check_fabric(tmp_path, environ={}) == []

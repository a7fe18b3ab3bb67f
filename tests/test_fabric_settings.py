"""Fabric settings of the verbs transport (service level, traffic class, min_rnr_timer): bad
values from arguments or the environment raise InvalidArgumentError naming the value and the
range, before any device is opened (so on any host). That they reach the QPs is shown in the
rxe guest (tests/rdma/test_rdma_scale.py)."""

from __future__ import annotations

import pytest

from rdmaxfer import Engine, InvalidArgumentError


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"service_level": 16}, "service_level=16 is outside 0..15"),
        ({"traffic_class": 256}, "traffic_class=256 is outside 0..255"),
        ({"min_rnr_timer": 32}, "min_rnr_timer=32 is outside 0..31"),
        ({"traffic_class": -2}, "traffic_class=-2 is outside 0..255"),
    ],
)
def test_bad_argument(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Engine("rdma", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RDMAXFER_SERVICE_LEVEL", "99", "RDMAXFER_SERVICE_LEVEL=99 is not an integer in 0..15"),
        ("RDMAXFER_TRAFFIC_CLASS", "af41", "RDMAXFER_TRAFFIC_CLASS=af41 is not an integer"),
        ("RDMAXFER_MIN_RNR_TIMER", "-1", "RDMAXFER_MIN_RNR_TIMER=-1 is not an integer in 0..31"),
    ],
)
def test_bad_environment(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidArgumentError, match=message):
        Engine("rdma")


def test_argument_wins_over_a_bad_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the argument given the variable is not read: what fails next is the device (no
    RDMA here), not the setting."""
    monkeypatch.setenv("RDMAXFER_TRAFFIC_CLASS", "bogus")
    try:
        Engine("rdma", traffic_class=104).close()
    except InvalidArgumentError as e:
        pytest.fail(f"the argument should win over the variable: {e}")
    except Exception as e:  # no verbs device on this host
        assert "TRAFFIC_CLASS" not in str(e)

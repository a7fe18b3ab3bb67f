"""transport="auto"'s rule, without hardware: verbs RC where a device offers it, then libfabric's
hardware RDMA providers (EFA, whose verbs device has SRD queue pairs and no RC), then TCP, with
shm for same-host peers (test_auto_transport.py); ``_core.choose_automatic`` is the rule itself,
fed made-up refusals. On this host (no RDMA device), auto never takes ofi over an emulated
provider, and an automatic engine's ``Endpoint.info`` says why its transport."""

from __future__ import annotations

import pytest

from _common import OFI_ENV
from rdmaxfer import Engine, UnsupportedError, _core

NO_RC = "no RDMA device with an active port and RC queue pairs (found: efa0; without RC: efa0)"
NO_DEVICE = "no RDMA device with an active port (ibv_get_device_list found no device)"
EMULATED = "RDMAXFER_OFI_PROVIDER names tcp;ofi_rxm, which emulates RDMA over sockets or memory"


def ranks() -> dict[str, int]:
    return {n: int(c["auto_rank"]) for n, c in _core.transports().items() if c["network"]}


def candidates(rdma: str, ofi: str, tcp: str = "") -> list[tuple[str, int, str]]:
    r = ranks()
    return [("tcp", r["tcp"], tcp), ("ofi", r["ofi"], ofi), ("rdma", r["rdma"], rdma)]


def test_this_build_ranks_verbs_then_ofi_then_tcp() -> None:
    r = ranks()
    assert r["rdma"] > r["ofi"] > r["tcp"] > 0
    assert "shm" not in r  # same-host peers only: the companion, never the network transport


def test_verbs_rc_wins_where_a_device_offers_it() -> None:
    assert _core.choose_automatic(candidates(rdma="", ofi="")) == (
        "rdma",
        "rdma: ranked first and usable here",
    )


def test_ofi_where_only_libfabric_reaches_the_rdma_nic() -> None:
    name, why = _core.choose_automatic(candidates(rdma=NO_RC, ofi=""))
    assert name == "ofi"
    assert why == f"ofi: rdma not usable ({NO_RC})"


def test_tcp_last_with_every_refusal() -> None:
    name, why = _core.choose_automatic(candidates(rdma=NO_DEVICE, ofi=EMULATED))
    assert name == "tcp"
    assert why == f"tcp: rdma not usable ({NO_DEVICE}); ofi not usable ({EMULATED})"


def test_refusals_below_the_choice_are_never_asked() -> None:
    assert _core.choose_automatic(candidates(rdma="", ofi="", tcp="never asked"))[0] == "rdma"


def test_rank_zero_is_never_taken_and_ties_go_by_name() -> None:
    assert _core.choose_automatic([("zeta", 1, ""), ("alpha", 1, ""), ("never", 0, "")])[0] == (
        "alpha"
    )
    with pytest.raises(UnsupportedError, match=r"no network transport can run here"):
        _core.choose_automatic([("never", 0, "")])


def test_none_usable_names_each_refusal() -> None:
    with pytest.raises(UnsupportedError) as info:
        _core.choose_automatic(candidates(rdma=NO_RC, ofi=EMULATED, tcp="no sockets"))
    text = str(info.value)
    assert f"rdma not usable ({NO_RC})" in text
    assert f"ofi not usable ({EMULATED})" in text and "tcp not usable (no sockets)" in text


@pytest.mark.parametrize("named", [True, False], ids=["tcp-ofi_rxm-named", "no-provider-named"])
def test_auto_takes_tcp_not_an_emulated_ofi_provider_here(
    monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    if _core.available_transports()["rdma"] == "":
        pytest.skip("an RDMA device is active here: auto takes rdma")
    monkeypatch.delenv("RDMAXFER_TRANSPORT", raising=False)
    for key, value in OFI_ENV.items():
        monkeypatch.setenv(key, value)
    if not named:
        monkeypatch.delenv("RDMAXFER_OFI_PROVIDER")
    with Engine("tcp") as server, Engine("auto") as auto:
        assert auto.transport == "tcp"
        port = server.listen("127.0.0.1", 0)
        ep = auto.connect("127.0.0.1", port, timeout=30)
        peer = server.accept(timeout=30)
        assert ep.info["transport"] == "tcp" and "auto" not in peer.info
        why = str(ep.info["auto"])
        assert why.startswith("tcp: rdma not usable (") and "; ofi not usable (" in why, why
        assert ("emulates RDMA" in why) or ("libfabric" in why), why

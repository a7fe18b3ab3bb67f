"""What the ofi transport decides from a provider's fi_info (_core.ofi_decide_settings, the
very function the transport runs on fi_getinfo's answers), checked against EFA's, verbs;ofi_rxm's
and tcp;ofi_rxm's answers without their hardware or libfabric; and ``doctor``'s libfabric check
(EFA NICs per GPU) on a fake sysfs tree."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from rdmaxfer import _core
from rdmaxfer.tools.doctor_ofi import check_ofi, efa_devices

B = _core.OFI_BITS
RMA = B["FI_MSG"] | B["FI_RMA"] | B["FI_READ"] | B["FI_WRITE"] | B["FI_REMOTE_READ"]
RMA |= B["FI_REMOTE_WRITE"]

#: The efa provider's answer on a p4d/p5 instance (libfabric 1.17+): RDM only, provider keys,
#: local MR descriptors, 4 bytes of CQ data, 32-byte inject, about 1 GiB per RMA.
EFA: dict[str, Any] = {
    "provider": "efa",
    "domain": "rdmap16s27-rdm",
    "caps": RMA | B["FI_HMEM"],
    "mr_mode": B["FI_MR_LOCAL"] | B["FI_MR_VIRT_ADDR"] | B["FI_MR_ALLOCATED"]
    | B["FI_MR_PROV_KEY"] | B["FI_MR_HMEM"],
    "cq_data_size": 4,
    "mr_key_size": 4,
    "max_msg_size": 1 << 30,
    "inject_size": 32,
}  # fmt: skip


def test_efa_requirements_come_from_its_fi_info() -> None:
    s = _core.ofi_decide_settings(**EFA)
    assert s["refused"] == ""
    assert s["efa"] and s["rdma_fabric"] and s["hmem"]
    assert s["mr_prov_key"] and s["mr_local"] and s["mr_virt_addr"] and s["mr_allocated"]
    assert s["mr_hmem"] and not s["mr_endpoint"]
    assert (s["max_msg_size"], s["inject_size"], s["cq_data_size"]) == (1 << 30, 32, 4)
    assert not s["delivery_complete"]
    assert s["summary"] == (
        "provider efa on rdmap16s27-rdm, MR mode FI_MR_LOCAL|FI_MR_VIRT_ADDR|FI_MR_ALLOCATED|"
        "FI_MR_PROV_KEY|FI_MR_HMEM, max message 1073741824 bytes, inject 32 bytes, "
        "CQ data 4 bytes, GPU memory (FI_HMEM)"
    )


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"ep_type": B["FI_EP_MSG"]}, "offers no reliable datagram (FI_EP_RDM) endpoint"),
        ({"caps": B["FI_MSG"]}, "lacks one-sided READ/WRITE (FI_RMA)"),
        ({"cq_data_size": 0}, "carries 0 bytes of remote CQ data; notifications need 4"),
        ({"max_msg_size": 0}, "reports a max_msg_size of 0"),
        ({"mr_mode": 0, "mr_key_size": 2}, "has 2-byte MR keys; rdmaxfer's keys are 4 bytes"),
    ],
)
def test_a_provider_that_cannot_carry_rdmaxfer_is_refused_with_the_reason(
    change: dict[str, int], refusal: str
) -> None:
    assert _core.ofi_decide_settings(**{**EFA, **change})["refused"] == f"provider efa {refusal}"


def test_emulated_providers_are_told_apart() -> None:
    base = {**EFA, "mr_mode": 0, "caps": RMA, "cq_data_size": 8, "mr_key_size": 8}
    for provider, hardware in [
        ("verbs;ofi_rxm", True),
        ("psm3", True),
        ("tcp;ofi_rxm", False),
        ("udp;ofi_rxd", False),
        ("shm", False),
        ("sockets", False),
    ]:
        s = _core.ofi_decide_settings(**{**base, "provider": provider})
        assert (s["rdma_fabric"], s["efa"], s["refused"]) == (hardware, False, ""), provider


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def pci(sysfs: Path, bdf: str, path: str, vendor: str, cls: str) -> Path:
    node = sysfs / "devices" / path
    write(node / "vendor", vendor)
    write(node / "class", cls)
    link = sysfs / "bus/pci/devices" / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(node, link.parent))
    return node


def efa_nic(sysfs: Path, name: str, bdf: str, path: str) -> None:
    node = pci(sysfs, bdf, path, "0x1d0f", "0x020000")
    (sysfs / "bus/pci/drivers/efa").mkdir(parents=True, exist_ok=True)
    (node / "driver").symlink_to(sysfs / "bus/pci/drivers/efa")
    dev = sysfs / "class/infiniband" / name
    dev.mkdir(parents=True)
    (dev / "device").symlink_to(sysfs / "bus/pci/devices" / bdf)


def test_doctor_reports_efa_nics_per_gpu(tmp_path: Path) -> None:
    left = "pci0000:00/0000:00:01.0/0000:01:00.0"
    right = "pci0000:80/0000:80:01.0/0000:81:00.0"
    pci(tmp_path, "0000:03:00.0", f"{left}/0000:02:00.0/0000:03:00.0", "0x10de", "0x030200")
    pci(tmp_path, "0000:83:00.0", f"{right}/0000:82:00.0/0000:83:00.0", "0x10de", "0x030200")
    efa_nic(tmp_path, "rdmap4s0", "0000:04:00.0", f"{left}/0000:02:01.0/0000:04:00.0")
    efa_nic(tmp_path, "rdmap5s0", "0000:05:00.0", f"{left}/0000:02:02.0/0000:05:00.0")
    assert efa_devices(tmp_path) == ["rdmap4s0", "rdmap5s0"]
    providers = [{**_core.ofi_decide_settings(**EFA), "domain": "rdmap4s0-rdm"}]
    findings = check_ofi(tmp_path, providers)
    by = {(f.check, f.subject): f for f in findings}
    assert by[("ofi.providers", "libfabric")].message == "RDMA: efa (rdmap4s0-rdm)"
    near = by[("ofi.efa", "GPU 0000:03:00.0")]
    assert near.severity == "ok"
    assert near.message == "2 EFA NIC(s) nearest: rdmap4s0 (PIX), rdmap5s0 (PIX)"
    far = by[("ofi.efa", "GPU 0000:83:00.0")]
    assert far.severity == "warn" and "no EFA NIC behind the same PCIe switch" in far.message


def test_doctor_without_libfabric_says_what_to_install(tmp_path: Path) -> None:
    [f] = check_ofi(tmp_path, "libfabric.so.1 not found: ... (install libfabric1 ...)")
    assert (f.check, f.severity) == ("ofi.libfabric", "info") and "libfabric1" in f.fix
    [g] = check_ofi(tmp_path, [{**_core.ofi_decide_settings(**EFA), "provider": "tcp;ofi_rxm",
                                "rdma_fabric": False}])  # fmt: skip
    assert g.message == "no hardware RDMA provider; emulated only: tcp;ofi_rxm"

"""PCIe topology classification and the GPUDirect preflight, on fake sysfs trees."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from rdmaxfer.gpu import gpudirect, topology

GPU = "0000:1b:00.0"


def _device(root: Path, chain: list[str], numa: int = 0) -> None:
    """Create /sys/devices/<chain...> and /sys/bus/pci/devices/<last> -> it."""
    real = root / "devices" / Path(*chain)
    real.mkdir(parents=True, exist_ok=True)
    (real / "numa_node").write_text(f"{numa}\n")
    link = root / "bus" / "pci" / "devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        os.symlink(os.path.relpath(real, link.parent), link)


def _nic(root: Path, name: str, chain: list[str] | None, numa: int = 0) -> None:
    ib = root / "class" / "infiniband" / name
    ib.mkdir(parents=True, exist_ok=True)
    if chain is not None:
        _device(root, chain, numa)
        os.symlink(os.path.relpath(root / "devices" / Path(*chain), ib), ib / "device")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """Two sockets. Socket 0: root complex pci0000:00 with a PCIe switch (upstream 01:00.0,
    downstream 02:00.0 and 02:01.0) holding the GPU and mlx5_0; a second switch level under
    02:02.0 holding mlx5_1; root port 00:03.0 holding mlx5_2. Root complex pci0000:40 on the
    same NUMA node holds mlx5_3; pci0000:80 on socket 1 holds mlx5_4. rxe0 has no PCI device."""
    sw = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    _device(tmp_path, [*sw, "0000:02:00.0", GPU])
    _nic(tmp_path, "mlx5_0", [*sw, "0000:02:01.0", "0000:1c:00.0"])
    _nic(tmp_path, "mlx5_1", [*sw, "0000:02:02.0", "0000:05:00.0", "0000:06:00.0", "0000:07:00.0"])
    _nic(tmp_path, "mlx5_2", ["pci0000:00", "0000:00:03.0", "0000:30:00.0"])
    _nic(tmp_path, "mlx5_3", ["pci0000:40", "0000:40:01.0", "0000:41:00.0"], numa=0)
    _nic(tmp_path, "mlx5_4", ["pci0000:80", "0000:80:01.0", "0000:81:00.0"], numa=1)
    _nic(tmp_path, "rxe0", None)
    return tmp_path


@pytest.mark.parametrize(
    ("nic", "kind"),
    [
        ("0000:1c:00.0", "PIX"),
        ("0000:07:00.0", "PXB"),
        ("0000:30:00.0", "PHB"),
        ("0000:41:00.0", "NODE"),
        ("0000:81:00.0", "SYS"),
    ],
)
def test_link_classes(sysfs: Path, nic: str, kind: str) -> None:
    assert topology.link(GPU, nic, sysfs) == kind
    assert topology.link(nic, GPU, sysfs) == kind  # symmetric


def test_missing_device_has_no_link(sysfs: Path) -> None:
    assert topology.link(GPU, "0000:ff:00.0", sysfs) is None
    assert topology.pci_path("0000:ff:00.0", sysfs) is None


def test_pci_path_and_bdf_spelling(sysfs: Path) -> None:
    assert topology.pci_path("00000000:1B:00.0", sysfs) == [
        "pci0000:00",
        "0000:00:01.0",
        "0000:01:00.0",
        "0000:02:00.0",
        GPU,
    ]
    assert topology.normalize_bdf("00000000:3B:00.0") == "0000:3b:00.0"
    with pytest.raises(ValueError, match="not a PCI address"):
        topology.normalize_bdf("mlx5_0")


def test_nearest_nics_are_ranked(sysfs: Path) -> None:
    nics = topology.nearest_nics(GPU, sysfs)
    assert [(n.name, n.link) for n in nics] == [
        ("mlx5_0", "PIX"),
        ("mlx5_1", "PXB"),
        ("mlx5_2", "PHB"),
        ("mlx5_3", "NODE"),
        ("mlx5_4", "SYS"),
        ("rxe0", None),
    ]
    assert nics[-1].software and not nics[0].software
    assert topology.list_rdma_devices(sysfs)["rxe0"] == ""
    assert topology.is_software_rdma("rxe0", sysfs)
    assert not topology.is_software_rdma("mlx5_0", sysfs)


def test_no_infiniband_class(tmp_path: Path) -> None:
    assert topology.list_rdma_devices(tmp_path) == {}
    assert topology.nearest_nics(GPU, tmp_path) == []


def _status(dma_buf: bool = True, handle: bool = True, unavailable: str = "") -> dict[str, Any]:
    return {
        "unavailable": unavailable,
        "driver_version": 12040,
        "get_handle_for_address_range": handle,
        "gpus": [] if unavailable else [{"index": 0, "pci_bus_id": GPU, "dma_buf": dma_buf}],
    }


def _peermem(root: Path) -> None:
    (root / "module" / "nvidia_peermem").mkdir(parents=True)


def test_preflight_prefers_dmabuf(sysfs: Path) -> None:
    _peermem(sysfs)
    p = gpudirect.preflight(
        "rdma",
        rdma_device="mlx5_0",
        cuda_status=_status(),
        sysfs_root=sysfs,
        kernel_release="6.5.0-1-generic",
    )
    assert p.method == "dmabuf"
    assert p.reasons == {"dmabuf": "", "peermem": "", "staging": ""}
    assert "dmabuf: available <- used" in p.describe()


def test_preflight_old_kernel_falls_back_to_peermem(sysfs: Path) -> None:
    _peermem(sysfs)
    p = gpudirect.preflight(
        "rdma",
        rdma_device="mlx5_0",
        cuda_status=_status(),
        sysfs_root=sysfs,
        kernel_release="5.4.0-150-generic",
    )
    assert p.method == "peermem"
    assert "kernel 5.4" in p.reasons["dmabuf"] and ">= 5.12" in p.reasons["dmabuf"]


@pytest.mark.parametrize(
    ("status", "verbs", "needle"),
    [
        (_status(dma_buf=False), "", "open NVIDIA kernel modules"),
        (_status(handle=False), "", "cuMemGetHandleForAddressRange"),
        (_status(), "libibverbs.so.1 lacks ibv_reg_dmabuf_mr", "ibv_reg_dmabuf_mr"),
    ],
)
def test_preflight_dmabuf_reasons(
    sysfs: Path, status: dict[str, Any], verbs: str, needle: str
) -> None:
    p = gpudirect.preflight(
        "rdma",
        rdma_device="mlx5_0",
        cuda_status=status,
        sysfs_root=sysfs,
        kernel_release="6.1.0",
        verbs_dmabuf=verbs,
    )
    assert needle in p.reasons["dmabuf"]
    assert "nvidia-peermem" in p.reasons["peermem"] and "modprobe" in p.reasons["peermem"]
    assert p.method == "staging"


def test_preflight_legacy_peer_mem_module(sysfs: Path) -> None:
    (sysfs / "module" / "nv_peer_mem").mkdir(parents=True)
    p = gpudirect.preflight(
        "rdma",
        rdma_device="mlx5_0",
        cuda_status=_status(dma_buf=False),
        sysfs_root=sysfs,
        kernel_release="6.1.0",
    )
    assert p.method == "peermem"


@pytest.mark.parametrize(
    ("transport", "device", "status", "needle"),
    [
        ("tcp", None, _status(), "moves bytes with the CPU"),
        ("rdma", "rxe0", _status(), "software RDMA device"),
        ("rdma", "mlx5_0", _status(unavailable="no CUDA: libcuda.so.1 not found"), "no CUDA"),
    ],
)
def test_preflight_staging_only(
    sysfs: Path, transport: str, device: str | None, status: dict[str, Any], needle: str
) -> None:
    _peermem(sysfs)
    p = gpudirect.preflight(
        transport,
        rdma_device=device,
        cuda_status=status,
        sysfs_root=sysfs,
        kernel_release="6.5.0",
    )
    assert p.method == "staging"
    assert needle in p.reasons["dmabuf"] and needle in p.reasons["peermem"]
    assert p.reasons["staging"] == ""


def test_preflight_unknown_gpu(sysfs: Path) -> None:
    p = gpudirect.preflight("rdma", cuda_status=_status(), gpu=3, sysfs_root=sysfs)
    assert p.method == "staging" and "cuda:3 is not a GPU" in p.reasons["peermem"]


def test_kernel_version() -> None:
    assert gpudirect.kernel_version("5.15.0-91-generic") == (5, 15)
    assert gpudirect.kernel_version("6.8.12") == (6, 8)
    assert gpudirect.kernel_version("garbage") == (0, 0)
    assert gpudirect.kernel_version() >= (2, 6)


def test_nearest_rail_picks_the_closest_of_an_engines_devices(sysfs: Path) -> None:
    """Small transfers from GPU memory go on this rail (Region.home_rail)."""
    assert topology.nearest_rail(GPU, ["mlx5_4", "mlx5_2", "mlx5_1"], sysfs) == 2  # PXB
    assert topology.nearest_rail(GPU, ["mlx5_4", "mlx5_3"], sysfs) == 1  # NODE before SYS
    assert topology.nearest_rail(GPU, ["rxe0"], sysfs) == -1  # no PCI path
    assert topology.nearest_rail("0000:ff:00.0", ["mlx5_0"], sysfs) == -1


def test_nearest_rail_reads_libfabric_domain_names_as_their_devices(sysfs: Path) -> None:
    """An ofi engine's rails are libfabric domains: EFA's "<device>-rdm" is that device."""
    assert topology.rail_device("rdmap16s27-rdm") == "rdmap16s27"
    assert topology.rail_device("mlx5_1-xrc") == "mlx5_1"
    assert topology.rail_device("rxe0") == "rxe0"
    assert topology.nearest_rail(GPU, ["mlx5_4-rdm", "mlx5_2-rdm", "mlx5_1-rdm"], sysfs) == 2

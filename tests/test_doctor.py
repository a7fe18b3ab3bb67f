"""rdmaxfer doctor against fake sysfs/procfs trees: every check, a good and a bad variant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rdmaxfer.gpu.report import gpu_report
from rdmaxfer.tools import doctor
from rdmaxfer.tools.doctor import Finding, run_checks
from rdmaxfer.tools.doctor_fork import check_fork

GPU = "0000:03:00.0"
NIC = "0000:04:00.0"
FAR_NIC = "0000:81:00.0"
ROCE_V4_GID = "0000:0000:0000:0000:0000:ffff:0a4d:0001"
LINK_LOCAL_GID = "fe80:0000:0000:0000:0000:00ff:fe00:0001"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


class Tree:
    """A fake machine: one GPU and one RoCE NIC behind one PCIe switch, healthy settings; the
    CUDA driver's and libibverbs' facts are fakes too (``cuda``, ``verbs_dmabuf``)."""

    def __init__(self, root: Path) -> None:
        self.sys = root / "sys"
        self.proc = root / "proc"
        self.cuda: dict[str, Any] = {
            "unavailable": "",
            "driver_version": 12040,
            "get_handle_for_address_range": True,
            "cuda_ipc": "",
            "can_access_peer": True,
            "gpus": [
                {
                    "index": 0,
                    "name": "NVIDIA H100",
                    "pci_bus_id": GPU,
                    "total_memory": 80 << 30,
                    "compute_capability": "9.0",
                    "gpu_direct_rdma": True,
                    "dma_buf": True,
                }
            ],
        }
        self.verbs_dmabuf = ""
        self.limits("unlimited")
        for key, value in {
            "net/core/rmem_max": "67108864",
            "net/core/wmem_max": "134217728",
            "net/ipv4/tcp_rmem": "4096\t131072\t67108864",
            "net/ipv4/tcp_wmem": "4096\t16384\t67108864",
            "net/ipv4/tcp_window_scaling": "1",
            "vm/swappiness": "10",
            "kernel/osrelease": "6.1.0-28-amd64",
        }.items():
            write(self.proc / "sys" / key, value)
        write(
            self.proc / "driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build",
        )
        (self.sys / "module/nvidia_peermem").mkdir(parents=True)
        write(self.sys / "module/nvidia_fs/version", "2.20.5")
        self.gds = {
            "library": "libcufile.so.0",
            "path": "/usr/local/cuda/targets/x86_64-linux/lib/libcufile.so.1.9.1",
            "version": "1.9",
            "unavailable": "",
        }
        self.ofi: list[dict[str, Any]] = [
            {"provider": "verbs;ofi_rxm", "domain": "mlx5_0", "rdma_fabric": True, "refused": ""}
        ]
        switch = "pci0000:00/0000:00:01.0/0000:01:00.0"
        self.pci(GPU, f"{switch}/0000:02:00.0/{GPU}", "0x10de", "0x030200", numa=0)
        self.pci(NIC, f"{switch}/0000:02:01.0/{NIC}", "0x15b3", "0x020000", numa=0)
        self.rdma("mlx5_0", NIC, "eth0", gids={0: LINK_LOCAL_GID, 1: ROCE_V4_GID})
        self.netdev("eth0", NIC, mtu=9000)
        self.irqs(NIC, {40: "0", 41: "1", 42: "2", 43: "3"}, local="0-7")

    def limits(self, soft: str) -> None:
        write(
            self.proc / "self/limits",
            "Limit                     Soft Limit           Hard Limit           Units\n"
            f"Max locked memory         {soft:<20} {soft:<20} bytes",
        )

    def pci(self, bdf: str, path: str, vendor: str, cls: str, numa: int) -> Path:
        node = self.sys / "devices" / path
        for name, value in {
            "vendor": vendor,
            "class": cls,
            "numa_node": str(numa),
            "current_link_width": "16",
            "max_link_width": "16",
            "current_link_speed": "16.0 GT/s PCIe",
            "max_link_speed": "16.0 GT/s PCIe",
        }.items():
            write(node / name, value)
        link = self.sys / "bus/pci/devices" / bdf
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(node, link.parent))
        return node

    def rdma(self, name: str, bdf: str, ndev: str, gids: dict[int, str]) -> None:
        dev = self.sys / "class/infiniband" / name
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "device").symlink_to(self.sys / "bus/pci/devices" / bdf)
        port = dev / "ports/1"
        write(port / "state", "4: ACTIVE")
        write(port / "phys_state", "5: LinkUp")
        write(port / "link_layer", "Ethernet")
        for i, gid in gids.items():
            write(port / "gids" / str(i), gid)
            write(port / "gid_attrs/types" / str(i), "RoCE v2")
            write(port / "gid_attrs/ndevs" / str(i), ndev)

    def netdev(self, name: str, bdf: str, mtu: int) -> None:
        dev = self.sys / "class/net" / name
        write(dev / "mtu", str(mtu))
        write(dev / "qos/trust", "dscp")
        write(dev / "qos/pfc", "1 0 0 0 0 0 0 0")  # lossless priority 0: traffic class 0's
        (dev / "device").symlink_to(self.sys / "bus/pci/devices" / bdf)

    def irqs(self, bdf: str, affinity: dict[int, str], local: str) -> None:
        node = self.sys / "bus/pci/devices" / bdf
        write(node / "local_cpulist", local)
        for irq, cpus in affinity.items():
            write(node / "msi_irqs" / str(irq), "msix")
            write(self.proc / "irq" / str(irq) / "smp_affinity_list", cpus)

    def run(self, need: int = 1 << 30) -> list[Finding]:
        return run_checks(
            sysfs=self.sys,
            procfs=self.proc,
            need=need,
            cuda_status=self.cuda,
            verbs_dmabuf=self.verbs_dmabuf,
            gds_status=self.gds,
            ofi_providers=self.ofi,
        )

    def info(self) -> dict[str, Any]:
        """What ``rdmaxfer info`` reports about GPUs on this machine (rdma usable)."""
        return gpu_report(
            {"rdma": ""},
            self.sys,
            rdma_device="mlx5_0",
            procfs_root=self.proc,
            cuda_status=self.cuda,
            verbs_dmabuf=self.verbs_dmabuf,
        )


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


def only(findings: list[Finding], check: str, subject: str | None = None) -> Finding:
    hits = [f for f in findings if f.check == check and (subject is None or subject in f.subject)]
    assert len(hits) == 1, f"{check}/{subject}: {hits}"
    return hits[0]


def test_healthy_machine_is_all_ok(tree: Tree) -> None:
    findings = tree.run()
    bad = [f for f in findings if f.severity != "ok"]
    assert bad == []
    checks = {f.check for f in findings}
    assert checks == {
        "memlock", "rdma.devices", "rdma.port", "rdma.mtu", "rdma.gid", "gpu.driver",
        "gpu.method", "gpu.dmabuf", "gpu.peermem", "pcie.affinity", "pcie.link", "irq.affinity",
        "sysctl", "shm", "fabric", "gpu.cuda_ipc", "gds.library", "gds.nvidia_fs",
        "gds.kernel_modules", "fork", "ofi.providers",
    }  # fmt: skip
    gds = only(findings, "gds.library").message
    assert gds.startswith("libcufile 1.9 from /usr/local/cuda/") and "cuFileRead" in gds
    assert only(findings, "gds.nvidia_fs").message == "nvidia-fs 2.20.5 loaded"
    assert only(findings, "pcie.affinity").message.startswith("nearest NIC mlx5_0: PIX")
    assert "active MTU 4096" in only(findings, "rdma.mtu").message
    assert doctor.worst(findings) == "ok"


def test_memlock(tree: Tree) -> None:
    tree.limits(str(64 << 20))
    f = only(tree.run(need=1 << 30), "memlock")
    assert f.severity == "error" and "64 MiB" in f.message and "ulimit -l unlimited" in f.fix
    assert only(tree.run(need=32 << 20), "memlock").severity == "ok"
    tree.limits("unlimited")
    assert only(tree.run(), "memlock").message == "unlimited"


def test_memlock_without_rdma_is_a_warning(tree: Tree) -> None:
    import shutil

    shutil.rmtree(tree.sys / "class/infiniband")
    tree.limits("8388608")
    findings = tree.run()
    assert only(findings, "memlock").severity == "warn"
    f = only(findings, "rdma.devices")
    assert f.severity == "info" and "rdma link add" in f.fix


def test_port_down(tree: Tree) -> None:
    write(tree.sys / "class/infiniband/mlx5_0/ports/1/state", "1: DOWN")
    write(tree.sys / "class/infiniband/mlx5_0/ports/1/phys_state", "3: Disabled")
    f = only(tree.run(), "rdma.port")
    assert f.severity == "error" and "1: DOWN" in f.message
    assert "ip link set dev eth0 up" in f.fix


def test_small_netdev_mtu(tree: Tree) -> None:
    write(tree.sys / "class/net/eth0/mtu", "1500")
    f = only(tree.run(), "rdma.mtu")
    assert f.severity == "warn" and "active MTU to 1024" in f.message
    assert "ip link set dev eth0 mtu 9000" in f.fix


def test_gid_tables(tree: Tree) -> None:
    gids = tree.sys / "class/infiniband/mlx5_0/ports/1/gids"
    write(gids / "1", ZERO_GID)
    f = only(tree.run(), "rdma.gid")
    assert f.severity == "warn" and "link-local" in f.message
    write(gids / "0", ZERO_GID)
    f = only(tree.run(), "rdma.gid")
    assert f.severity == "error" and "ip addr add" in f.fix and "eth0" in f.fix
    write(gids / "1", ROCE_V4_GID)
    assert only(tree.run(), "rdma.gid").severity == "ok"


def test_gpu_memory_paths(tree: Tree) -> None:
    write(tree.proc / "driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module 535")
    findings = tree.run()
    f = only(findings, "gpu.dmabuf")
    assert f.severity == "warn" and "closed" in f.message and "open" in f.fix
    assert only(findings, "gpu.peermem").severity == "ok"
    (tree.sys / "module/nvidia_peermem").rmdir()
    f = only(tree.run(), "gpu.peermem")
    assert f.severity == "warn" and "modprobe nvidia-peermem" in f.fix


def test_old_kernel_has_no_dmabuf(tree: Tree) -> None:
    write(tree.proc / "sys/kernel/osrelease", "5.4.0-150-generic")
    f = only(tree.run(), "gpu.dmabuf")
    assert f.severity == "warn" and "kernel 5.4 has no dmabuf" in f.message
    assert "Linux >= 5.12" in f.message


def test_peermem_missing_is_info_when_dmabuf_works(tree: Tree) -> None:
    (tree.sys / "module/nvidia_peermem").rmdir()
    assert only(tree.run(), "gpu.peermem").severity == "info"


@pytest.mark.parametrize(
    ("variant", "method"),
    [
        ("healthy", "dmabuf"),
        ("closed modules", "peermem"),
        ("old kernel", "peermem"),
        ("no ibv_reg_dmabuf_mr", "peermem"),
        ("GPU without dmabuf", "peermem"),
        ("closed modules, no peermem", "staging"),
    ],
)
def test_info_and_doctor_make_one_gpudirect_decision(tree: Tree, variant: str, method: str) -> None:
    """``rdmaxfer info`` and ``rdmaxfer doctor`` report the same registration, for the same
    reasons, from the same facts (issue 12: the decision is made once)."""
    if "closed" in variant:
        write(tree.proc / "driver/nvidia/version", "NVRM version: NVIDIA UNIX Kernel Module 535")
    if "no peermem" in variant:
        (tree.sys / "module/nvidia_peermem").rmdir()
    if variant == "old kernel":
        write(tree.proc / "sys/kernel/osrelease", "5.4.0-150-generic")
    if variant == "no ibv_reg_dmabuf_mr":
        tree.verbs_dmabuf = "libibverbs 28 has no ibv_reg_dmabuf_mr"
    if variant == "GPU without dmabuf":
        tree.cuda["gpus"][0]["dma_buf"] = False
    decision = tree.info()["gpudirect"]["rdma"]
    findings = tree.run()
    assert decision["method"] == method
    assert only(findings, "gpu.method", "cuda:0").message.startswith(f"{method}: ")
    dmabuf, peermem = only(findings, "gpu.dmabuf"), only(findings, "gpu.peermem")
    assert (dmabuf.severity == "ok") == (decision["reasons"]["dmabuf"] == "")
    assert (peermem.severity == "ok") == (decision["reasons"]["peermem"] == "")
    if decision["reasons"]["dmabuf"]:
        assert decision["reasons"]["dmabuf"] in dmabuf.message


def test_no_gpu_driver(tree: Tree) -> None:
    (tree.proc / "driver/nvidia/version").unlink()
    findings = tree.run()
    assert only(findings, "gpu.driver").severity == "info"
    assert not [f for f in findings if f.check in ("gpu.dmabuf", "gpu.peermem")]


def test_gds_missing_pieces(tree: Tree) -> None:
    """Without libcufile, nvidia-fs or the open kernel modules, doctor names each with its fix;
    on a machine without a GPU a missing libcufile is only information."""
    tree.gds = {
        "library": "libcufile.so.0",
        "path": "",
        "version": "",
        "unavailable": "no GPUDirect Storage: libcufile.so.0 not found (cannot open it)",
    }
    (tree.sys / "module/nvidia_fs/version").unlink()
    (tree.sys / "module/nvidia_fs").rmdir()
    write(tree.proc / "driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module")
    lib = only(tree.run(), "gds.library")
    assert (lib.severity, lib.subject) == ("warn", "GPUDirect Storage")
    assert "libcufile.so.0 not found" in lib.message and "pinned host buffers" in lib.message
    assert "apt install nvidia-gds" in lib.fix
    tree.gds = {**tree.gds, "path": "/opt/libcufile.so.1.7.2", "version": "1.7.2"}
    tree.gds["unavailable"] = "no GPUDirect Storage: cuFileDriverOpen: cuFile error 5026"
    findings = tree.run()
    lib = only(findings, "gds.library")
    assert lib.severity == "warn" and "libcufile 1.7.2 from /opt/libcufile.so.1.7.2 loads" in (
        lib.message
    )
    assert "cuFile error 5026" in lib.message
    nvfs = only(findings, "gds.nvidia_fs")
    assert nvfs.severity == "warn" and "modprobe nvidia-fs" in nvfs.fix
    modules = only(findings, "gds.kernel_modules")
    assert modules.severity == "warn" and "kernel-open" in modules.fix
    (tree.proc / "driver/nvidia/version").unlink()  # no GPU here
    tree.gds = {**tree.gds, "path": "", "version": ""}
    findings = tree.run()
    assert only(findings, "gds.library").severity == "info"
    assert not [f for f in findings if f.check in ("gds.nvidia_fs", "gds.kernel_modules")]


def test_gpu_and_nic_across_sockets(tree: Tree) -> None:
    import shutil

    shutil.rmtree(tree.sys / "class/infiniband/mlx5_0")
    tree.pci(FAR_NIC, f"pci0000:80/0000:80:01.0/{FAR_NIC}", "0x15b3", "0x020000", numa=1)
    tree.rdma("mlx5_1", FAR_NIC, "eth1", gids={1: ROCE_V4_GID})
    tree.netdev("eth1", FAR_NIC, mtu=9000)
    f = only(tree.run(), "pcie.affinity")
    assert f.severity == "warn" and "SYS" in f.message and "numactl" in f.fix


def test_gpu_and_nic_through_host_bridge(tree: Tree) -> None:
    import shutil

    shutil.rmtree(tree.sys / "class/infiniband/mlx5_0")
    other = "0000:05:00.0"
    tree.pci(other, f"pci0000:00/0000:00:02.0/{other}", "0x15b3", "0x020000", numa=0)
    tree.rdma("mlx5_2", other, "eth2", gids={1: ROCE_V4_GID})
    f = only(tree.run(), "pcie.affinity")
    assert f.severity == "info" and "PHB" in f.message


def test_tcp_sysctls(tree: Tree) -> None:
    write(tree.proc / "sys/net/core/rmem_max", "212992")
    write(tree.proc / "sys/net/ipv4/tcp_wmem", "4096\t16384\t33554432")
    write(tree.proc / "sys/net/ipv4/tcp_window_scaling", "0")
    write(tree.proc / "sys/vm/swappiness", "60")
    findings = tree.run()
    f = only(findings, "sysctl", "net.core.rmem_max")
    assert f.severity == "warn" and "sysctl -w net.core.rmem_max=67108864" in f.fix
    f = only(findings, "sysctl", "net.ipv4.tcp_wmem")
    assert f.severity == "info" and f.message.startswith("4096 16384 33554432")
    assert "4096 131072 67108864" in f.fix
    assert only(findings, "sysctl", "net.core.wmem_max").severity == "ok"
    assert only(findings, "sysctl", "tcp_window_scaling").severity == "error"
    f = only(findings, "sysctl", "vm.swappiness")
    assert f.severity == "info" and "vm.swappiness=10" in f.fix


def test_irq_affinity(tree: Tree) -> None:
    tree.irqs(NIC, {40: "0", 41: "0", 42: "0", 43: "0"}, local="0-7")
    f = only(tree.run(), "irq.affinity")
    assert f.severity == "warn" and "all 4 queue IRQs on CPU 0" in f.message
    assert "irqbalance" in f.fix and "0-7" in f.fix
    tree.irqs(NIC, {40: "8", 41: "9", 42: "2", 43: "3"}, local="0-7")
    f = only(tree.run(), "irq.affinity")
    assert f.severity == "warn" and "8,9" in f.message
    tree.irqs(NIC, {40: "0-3", 41: "4-7", 42: "2", 43: "3"}, local="0-7")
    assert only(tree.run(), "irq.affinity").severity == "ok"


def test_pcie_link_degraded(tree: Tree) -> None:
    nic = tree.sys / "bus/pci/devices" / NIC
    write(nic / "current_link_width", "8")
    f = only(tree.run(), "pcie.link", "NIC")
    assert f.severity == "warn" and "8/16" in f.message and "reseat" in f.fix
    write(nic / "current_link_width", "16")
    write(nic / "current_link_speed", "8.0 GT/s PCIe")
    assert only(tree.run(), "pcie.link", "NIC").severity == "warn"
    gpu = tree.sys / "bus/pci/devices" / GPU
    write(gpu / "current_link_speed", "2.5 GT/s PCIe")
    f = only(tree.run(), "pcie.link", "GPU")
    assert f.severity == "info" and "idle" in f.message


def test_doctor_never_writes(tree: Tree) -> None:
    def snapshot() -> dict[str, float]:
        return {
            str(p): p.stat().st_mtime for base in (tree.sys, tree.proc) for p in base.rglob("*")
        }

    before = snapshot()
    tree.run()
    assert snapshot() == before


def test_cli_json_and_table(tree: Tree) -> None:
    write(tree.proc / "sys/net/ipv4/tcp_window_scaling", "0")
    base = [sys.executable, "-m", "rdmaxfer", "doctor", "--sysfs", str(tree.sys)]
    base += ["--procfs", str(tree.proc)]
    out = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr  # an error finding
    report = json.loads(out.stdout)
    assert report["worst"] == "error"
    assert {"check", "severity", "subject", "message", "fix"} <= set(report["findings"][0])
    out = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert "rdmaxfer doctor" in out.stdout and "tcp_window_scaling" in out.stdout
    assert "1 error" in out.stdout


def test_format_table_plain(tree: Tree) -> None:
    text = doctor.format_table(tree.run(), width=200)
    assert "severity" in text and "mlx5_0 port 1" in text and "0 error" in text


@pytest.mark.parametrize(
    ("release", "verbs", "env", "severity", "says"),
    [
        ("6.1.0-18-amd64", "unneeded", {}, "ok", "kernel 6.1 copies pinned pages"),
        ("5.4.0", "disabled", {}, "warn", "predates Linux 5.9"),
        ("5.4.0", "disabled", {"RDMAV_FORK_SAFE": "1"}, "ok", "RDMAV_FORK_SAFE set"),
        ("5.4.0", "enabled", {}, "ok", "libibverbs fork support: enabled"),
        ("6.1.0", "", {}, "ok", "libibverbs not loaded"),
    ],
)
def test_fork_handling_is_reported(
    tmp_path: Path, release: str, verbs: str, env: dict[str, str], severity: str, says: str
) -> None:
    write(tmp_path / "sys/kernel/osrelease", release)
    (finding,) = check_fork(tmp_path, True, env, verbs)
    assert (finding.check, finding.severity) == ("fork", severity)
    assert says in finding.message and "inert in the child" in finding.message
    assert ("RDMAV_FORK_SAFE=1" in finding.fix) == (severity == "warn")


def test_fork_is_not_a_concern_without_rdma_devices(tmp_path: Path) -> None:
    write(tmp_path / "sys/kernel/osrelease", "4.19.0")
    (finding,) = check_fork(tmp_path, False, {}, "disabled")
    assert finding.severity == "ok" and "predates Linux 5.9" in finding.message

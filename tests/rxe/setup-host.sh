#!/usr/bin/env bash
# Install what tests/rxe/run-in-vm.sh needs on a Debian 12 (bookworm) x86_64 host, as root:
# QEMU, Debian's stock kernel (it ships rdma_rxe), rdma-core/perftest/pyverbs, libfabric (the ofi
# transport's tests, host and guest; fi_info/fi_pingpong for bench/ofi_bench.py), and
# virtme-ng in its own venv. Idempotent: when everything is present it returns in about a second.
#
#   tests/rxe/setup-host.sh            # install what is missing
#   RDMAXFER_VNG_VENV=/somewhere ...   # where the virtme-ng venv goes (default /opt/rdmaxfer-vng)
set -euo pipefail

VNG_VENV=${RDMAXFER_VNG_VENV:-/opt/rdmaxfer-vng}
VNG_VERSION=1.42

PKGS=(
    qemu-system-x86 busybox-static kmod iproute2 udev util-linux procps
    rdma-core ibverbs-utils ibverbs-providers libibverbs-dev librdmacm-dev
    perftest rdmacm-utils python3-pyverbs python3-venv libfabric1 libfabric-bin
    linux-image-amd64
)

log() { printf 'setup-host: %s\n' "$*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
    log "must run as root (apt-get install)"
    exit 1
fi

missing=()
for p in "${PKGS[@]}"; do
    if [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) != installed ]]; then
        missing+=("$p")
    fi
done

if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # INITRD=No: virtme-ng boots the kernel without an initramfs; building one costs ~2 min.
    export INITRD=No
    timeout 600 apt-get update -q
    timeout 1200 apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
else
    log "apt packages already installed"
fi

# The guest kernel must have rdma_rxe and 9p (the "cloud" flavour has neither).
kver=""
for k in /boot/vmlinuz-*-amd64; do
    [[ -e $k ]] || continue
    v=${k#/boot/vmlinuz-}
    [[ $v == *cloud* ]] && continue
    if [[ -n $(find "/lib/modules/$v" -name 'rdma_rxe.ko*' -print -quit 2>/dev/null) ]]; then
        kver=$v
    fi
done
if [[ -z $kver ]]; then
    log "no /boot/vmlinuz-*-amd64 with rdma_rxe.ko found after install"
    exit 1
fi
log "guest kernel: $kver"

if [[ -x $VNG_VENV/bin/vng ]] &&
    [[ $("$VNG_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("virtme-ng"))' 2>/dev/null || true) == "$VNG_VERSION" ]]; then
    log "virtme-ng $VNG_VERSION already in $VNG_VENV"
else
    log "installing virtme-ng $VNG_VERSION into $VNG_VENV"
    rm -rf "$VNG_VENV"
    # Debian's python3 keeps the venv independent of whatever python the project uses.
    /usr/bin/python3 -m venv "$VNG_VENV"
    timeout 600 "$VNG_VENV/bin/pip" install -q --disable-pip-version-check "virtme-ng==$VNG_VERSION"
fi
"$VNG_VENV/bin/vng" --version >&2
log "done"

#!/usr/bin/env bash
# Run a command inside a small QEMU guest (Debian's stock kernel, booted by virtme-ng) that has
# two soft-RoCE devices, rxe0 (veth0, 10.77.0.1) and rxe1 (veth1, 10.77.0.2), linked by a veth
# pair. The guest sees the host's root filesystem read-only and this repository read-write, so
# the project's venv and build outputs work unchanged. Install the prerequisites once with
# tests/rxe/setup-host.sh (as root).
#
#   tests/rxe/run-in-vm.sh [OPTIONS] -- CMD ARGS...
#   tests/rxe/run-in-vm.sh --setup-only
#
# Options:
#   --setup-only        boot, set up rxe, show the devices, run no command
#   --timeout SECONDS   limit for the whole run, boot included (default 1800)
#   --cpus N            guest CPUs (default: the host's, at most 4)
#   --memory SIZE       guest memory (default 4G)
#   --rails N           1 (default) or 2: with 2, a second veth pair (veth2 10.78.0.1, veth3
#                       10.78.0.2) carries rxe2 and rxe3, so one side has rails rxe0+rxe2 and
#                       the other rxe1+rxe3
#   --keep-udev         run the guest's real udev coldplug (slow under TCG; for debugging)
#   --verbose           show the guest kernel's console
#
# CMD runs as root in the caller's working directory with the caller's PATH, VIRTUAL_ENV,
# PYTHONPATH, PYENV_*, RDMAXFER_* (and a few more, see pass_env below), plus
#   RDMAXFER_RXE=1 RDMAXFER_RXE_DEVICES="rxe0 rxe1" RDMAXFER_RXE_NETDEVS="veth0 veth1"
#   RDMAXFER_RXE_ADDRS="10.77.0.1 10.77.0.2" RDMAXFER_GID_INDEX=1
#   RDMAXFER_PYVERBS_PATH (a directory holding only Debian's pyverbs, for a venv's sys.path)
#   RDMAXFER_RXE_RAILS=N, and with --rails 2 RDMAXFER_RXE_RAIL_DEVICES="rxe0,rxe2 rxe1,rxe3"
#   (each side's rails, comma-separated; the first of each is the one RDMAXFER_RXE_DEVICES names)
# and `ulimit -l unlimited`. Its stdout and stderr are merged, shown as they come and also
# written to tests/rxe/.last-run.log. The exit status is CMD's; 124 when the time limit was hit,
# 125 when the VM or the rxe set-up failed.
#
# Environment: RDMAXFER_VNG_VENV (virtme-ng venv, default /opt/rdmaxfer-vng),
# RDMAXFER_VM_KERNEL (a /boot/vmlinuz-* to boot instead of the newest one with rdma_rxe).
# shellcheck disable=SC2329  # functions called indirectly (traps, check, wait_for)
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd -- "$HERE/../.." && pwd -P)
VNG_VENV=${RDMAXFER_VNG_VENV:-/opt/rdmaxfer-vng}

usage() { # usage [STATUS]
    sed -n '2,/^[^#]/{/^# shellcheck/d; /^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" >&2
    exit "${1:-2}"
}
die() {
    printf 'run-in-vm: %s\n' "$*" >&2
    exit 125
}

timeout_s=1800
setup_only=0
cpus=$(nproc)
((cpus > 4)) && cpus=4
memory=4G
rails=1
keep_udev=0
verbose=0
while (($#)); do
    case $1 in
    --setup-only) setup_only=1 ;;
    --timeout) timeout_s=${2:?--timeout needs SECONDS}; shift ;;
    --timeout=*) timeout_s=${1#*=} ;;
    --cpus) cpus=${2:?--cpus needs N}; shift ;;
    --cpus=*) cpus=${1#*=} ;;
    --memory) memory=${2:?--memory needs SIZE}; shift ;;
    --memory=*) memory=${1#*=} ;;
    --rails) rails=${2:?--rails needs N}; shift ;;
    --rails=*) rails=${1#*=} ;;
    --keep-udev) keep_udev=1 ;;
    --verbose | -v) verbose=1 ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    *) printf 'run-in-vm: unknown option %q\n' "$1" >&2; usage ;;
    esac
    shift
done
[[ $timeout_s =~ ^[0-9]+$ ]] || die "--timeout wants whole seconds, got '$timeout_s'"
[[ $rails == 1 || $rails == 2 ]] || die "--rails wants 1 or 2, got '$rails'"
if ((!setup_only && $# == 0)); then
    usage
fi

# --- prerequisites -------------------------------------------------------------------------
[[ -x $VNG_VENV/bin/vng ]] || die "virtme-ng not found in $VNG_VENV: run tests/rxe/setup-host.sh (as root)"
command -v qemu-system-x86_64 > /dev/null || die "qemu-system-x86_64 missing: run tests/rxe/setup-host.sh"

find_kernel() { # newest /boot/vmlinuz-*-amd64 whose modules include rdma_rxe
    local k v best=""
    for k in /boot/vmlinuz-*; do
        [[ -r $k ]] || continue
        v=${k#/boot/vmlinuz-}
        [[ $v == *cloud* ]] && continue
        [[ -n $(find "/lib/modules/$v" -name 'rdma_rxe.ko*' -print -quit 2> /dev/null) ]] || continue
        if [[ -z $best ]] || [[ $(printf '%s\n%s\n' "$best" "$v" | sort -V | tail -n1) == "$v" ]]; then
            best=$v
        fi
    done
    [[ -n $best ]] && printf '/boot/vmlinuz-%s\n' "$best"
}
kernel=${RDMAXFER_VM_KERNEL:-$(find_kernel || true)}
[[ -n $kernel && -r $kernel ]] || die "no guest kernel with rdma_rxe in /boot: run tests/rxe/setup-host.sh"

# KVM only where the CPU really has it (here /dev/kvm can exist without vmx/svm and then hangs).
kvm_opt=(--disable-kvm)
if [[ -w /dev/kvm ]] && grep -qE '^flags.*\b(vmx|svm)\b' /proc/cpuinfo; then
    kvm_opt=()
fi

# --- hand the environment, cwd and command to the guest through a file ----------------------
# (virtme-ng resets PATH and the kernel command line is limited to 2 KiB.)
run_dir=$HERE/.run/$$
rm -rf "$run_dir"
mkdir -p "$run_dir"
cleanup() { rm -rf "$run_dir"; rmdir "$HERE/.run" 2> /dev/null || true; }
trap cleanup EXIT

cwd=$(pwd -P)
deadline=$(($(date +%s) + timeout_s))
log_file=$HERE/.last-run.log
{
    pass_env=(VIRTUAL_ENV PYTHONPATH PYTHONHASHSEED PYTHONDONTWRITEBYTECODE PYTHONUNBUFFERED
        PYTHONWARNINGS PYTEST_ADDOPTS PYENV_VERSION PYENV_ROOT CI LANG LC_ALL TZ)
    # pytest in one process (pyproject.toml's addopts start 4 xdist workers; the guest has two
    # emulated vCPUs, and two workers measured no faster), without the hypothesis and anyio
    # plugins, which no RDMA test uses: loading them (hypothesis imports all of itself) took
    # each pytest process in the guest about a minute under TCG, more than half of a short run.
    # What PYTEST_ADDOPTS or the command line says comes later and wins (-n 2, -p hypothesispytest).
    PYTEST_ADDOPTS="-n 0 -p no:hypothesispytest -p no:anyio${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"
    while IFS= read -r name; do pass_env+=("$name"); done < <(compgen -e RDMAXFER_ || true)
    for name in "${pass_env[@]}"; do
        [[ -n ${!name+set} ]] && printf 'export %s=%q\n' "$name" "${!name}"
    done
    printf 'RXE_PATH=%q\n' "$PATH"
    printf 'RXE_CWD=%q\n' "$cwd"
    printf 'RXE_DEADLINE=%d\n' "$deadline"
    printf 'RXE_LOG=%q\n' "$log_file"
    printf 'RXE_SETUP_ONLY=%d\n' "$setup_only"
    printf 'RXE_RAILS=%d\n' "$rails"
    rxe_cmd=("$@")
    declare -p rxe_cmd | sed 's/^declare -a rxe_cmd=/RXE_CMD=/'
} > "$run_dir/env"

vng_args=(--run "$kernel" "${kvm_opt[@]}" --force-9p --cpus "$cpus" --memory "$memory"
    --rwdir="$ROOT" --overlay-rwdir=/root --cwd "$cwd"
    --exec "bash $(printf '%q' "$HERE/guest.sh") $(printf '%q' "$run_dir")")
((verbose)) && vng_args=(-v "${vng_args[@]}")

# Replace udev (and systemd-tmpfiles) by stand-ins, visible only inside a private mount
# namespace holding vng and QEMU, whose 9p server gives the guest its root filesystem.
udevadm=$(command -v udevadm || true)
tmpfiles=$(command -v systemd-tmpfiles || true)
launcher=(env)
if ((!keep_udev)) && [[ -n $udevadm ]] && unshare --mount --propagation private true 2> /dev/null; then
    binds=""
    binds+="mount --bind $(printf '%q' "$HERE/standin/udevadm") $(printf '%q' "$(readlink -f "$udevadm")") && "
    [[ -n $tmpfiles ]] &&
        binds+="mount --bind $(printf '%q' "$HERE/standin/noop") $(printf '%q' "$(readlink -f "$tmpfiles")") && "
    launcher=(unshare --mount --propagation private -- bash -c "$binds"'exec env "$@"' run-in-vm)
fi

printf 'run-in-vm: booting %s (%s, %s CPUs, %s, %s rail(s)) for at most %ss\n' "$kernel" \
    "$([[ ${#kvm_opt[@]} -eq 0 ]] && echo KVM || echo TCG)" "$cpus" "$memory" "$rails" "$timeout_s" >&2
start=$(date +%s)
# timeout signals its whole process group, QEMU included; stdin must not be the caller's.
# QEMU reopens /proc/self/fd/1 and 2 with O_TRUNC, which would wipe (NUL-fill) a caller's log
# file: give it a pipe. Guest output arrives merged on stdout; vng's own messages join it.
# timeout makes a process group of its own, which a signal to this script's group (Ctrl-C, a
# caller's kill) does not reach: the traps pass it on, so QEMU never outlives this script.
set +e
timeout --kill-after=15 "$timeout_s" \
    "${launcher[@]}" PATH="$VNG_VENV/bin:$PATH" "$VNG_VENV/bin/vng" "${vng_args[@]}" \
    < /dev/null > >(cat) 2>&1 &
vm_pid=$!
stop_vm() { kill -TERM -- "-$vm_pid" 2> /dev/null; }
trap 'stop_vm; exit 130' INT
trap 'stop_vm; exit 143' TERM
trap 'stop_vm; exit 129' HUP
wait "$vm_pid"
vng_rc=$?
trap - INT TERM HUP
set -e
elapsed=$(($(date +%s) - start))

rc=""
[[ -s $run_dir/rc ]] && read -r rc < "$run_dir/rc"
if [[ -z $rc ]]; then
    if ((vng_rc == 124 || vng_rc == 137)); then
        printf 'run-in-vm: VM killed after the %ss time limit\n' "$timeout_s" >&2
        rc=124
    else
        printf 'run-in-vm: VM ended (vng status %s) after %ss without running the command\n' \
            "$vng_rc" "$elapsed" >&2
        rc=125
    fi
else
    printf 'run-in-vm: exit status %s after %ss (log: %s)\n' "$rc" "$elapsed" "${log_file#"$ROOT"/}" >&2
fi
exit "$rc"

#!/usr/bin/env bash
# Runs inside the rxe test VM (started by run-in-vm.sh; not meant to be called by hand).
#
#   guest.sh RUN_DIR
#
# RUN_DIR (under the read-write repo) holds `env` (the caller's environment, cwd, command and
# deadline, written by run-in-vm.sh). This script sets up two soft-RoCE devices per rail
# (RXE_RAILS, 1 or 2):
#
#   rxe0 on veth0 (10.77.0.1)  <-- veth pair, MTU 9000 -->  rxe1 on veth1 (10.77.0.2)
#   rxe2 on veth2 (10.78.0.1)  <-- veth pair, MTU 9000 -->  rxe3 on veth3 (10.78.0.2)  (2 rails)
#
# then runs the command with stdout and stderr merged, teeing them to the host and to
# tests/rxe/.last-run.log, and writes the command's exit status to RUN_DIR/rc.
# Exit status 125 in RUN_DIR/rc means the set-up failed.
# shellcheck disable=SC2329  # functions called indirectly (traps, check, wait_for)
set -euo pipefail

RUN_DIR=$1
read -r cmdline < /proc/cmdline
if [[ $cmdline != *virtme* ]]; then
    echo "guest.sh: not inside the virtme-ng VM; use tests/rxe/run-in-vm.sh" >&2
    exit 125
fi
# shellcheck source=/dev/null
source "$RUN_DIR/env"
# virtme-ng resets PATH; put the caller's first, then the system's.
export PATH="${RXE_PATH:+$RXE_PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SECONDS=0
log() { printf '[rxe-vm %3ds] %s\n' "$SECONDS" "$*"; }

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...: poll (0.1 s) until COMMAND succeeds
    local limit=$1 what=$2 i
    shift 2
    for ((i = 0; i < limit * 10; i++)); do
        "$@" && return 0
        sleep 0.1
    done
    log "timed out after ${limit}s waiting for $what"
    return 1
}

port_ready() { # port_ready DEV: port 1 ACTIVE and its GID[1] (IPv4-mapped RoCE v2) present
    local state gid
    read -r state < "/sys/class/infiniband/$1/ports/1/state" 2>/dev/null || return 1
    [[ $state == *ACTIVE* ]] || return 1
    read -r gid < "/sys/class/infiniband/$1/ports/1/gids/1" 2>/dev/null || return 1
    [[ $gid == 0000:0000:0000:0000:0000:ffff:* ]]
}

setup_pair() { # setup_pair I: veth(2I) 10.(77+I).0.1 <-> veth(2I+1) 10.(77+I).0.2, rxe(2I), rxe(2I+1)
    local i=$1 a=veth$((2 * $1)) b=veth$((2 * $1 + 1)) net=10.$((77 + $1)).0
    local ra=rxe$((2 * $1)) rb=rxe$((2 * $1 + 1))
    # Both addresses are local to this one kernel, so by default traffic between them goes
    # through `lo`, where rxe drops it. Route locally generated traffic for the other address
    # out through the veth pair instead: per-destination tables consulted (for `iif lo`, i.e.
    # locally generated, packets only) before the `local` table, which moves below them.
    ip -batch - <<EOF
link add $a mtu 9000 type veth peer name $b mtu 9000
addr add $net.1/24 dev $a
addr add $net.2/24 dev $b
link set $a up
link set $b up
route add $net.2/32 dev $a src $net.1 table $((100 + 2 * i))
route add $net.1/32 dev $b src $net.2 table $((101 + 2 * i))
rule add pref $((100 + 2 * i)) iif lo to $net.2/32 lookup $((100 + 2 * i))
rule add pref $((101 + 2 * i)) iif lo to $net.1/32 lookup $((101 + 2 * i))
EOF
    # Packets from a local source address arriving on veth must be accepted.
    local c
    for c in $a $b; do
        echo 1 > "/proc/sys/net/ipv4/conf/$c/accept_local"
        echo 0 > "/proc/sys/net/ipv4/conf/$c/rp_filter"
    done
    rdma -b - <<EOF
link add $ra type rxe netdev $a
link add $rb type rxe netdev $b
EOF
    wait_for 30 "$ra ACTIVE with GID[1]" port_ready "$ra"
    wait_for 30 "$rb ACTIVE with GID[1]" port_ready "$rb"
    local ga gb
    read -r ga < "/sys/class/infiniband/$ra/ports/1/gids/1"
    read -r gb < "/sys/class/infiniband/$rb/ports/1/gids/1"
    log "$ra ($a $net.1, GID[1] $ga) and $rb ($b $net.2, GID[1] $gb) ACTIVE"
}

setup_rxe() {
    log "kernel $(uname -r), $(nproc) cpus; setting up rxe (${RXE_RAILS:-1} rail(s))"
    modprobe -a veth ib_uverbs rdma_rxe rdma_ucm
    local c i
    for c in all default; do
        echo 1 > "/proc/sys/net/ipv4/conf/$c/accept_local"
        echo 0 > "/proc/sys/net/ipv4/conf/$c/rp_filter"
    done
    for ((i = 0; i < ${RXE_RAILS:-1}; i++)); do
        setup_pair "$i"
    done
    ip -batch - <<'EOF'
rule add pref 200 lookup local
rule del pref 0 lookup local
EOF
    local last=$((2 * ${RXE_RAILS:-1} - 1))
    [[ -e /dev/infiniband/uverbs$last ]] ||
        wait_for 10 "/dev/infiniband/uverbs*" test -e "/dev/infiniband/uverbs$last"
}

inner() { # set-up, then the command; stdout+stderr of both are merged by the caller
    # A subshell with its own errexit: `if ! setup_rxe` would silently disable set -e in it.
    local rc=0
    set +e
    (set -e; setup_rxe)
    rc=$?
    set -e
    if ((rc != 0)); then
        log "set-up failed (status $rc); dmesg tail:"
        dmesg | tail -n 30 || true
        echo 125 > "$RUN_DIR/rc"
        return 0
    fi
    ulimit -l unlimited
    ulimit -n 65536 2>/dev/null || true

    export RDMAXFER_RXE=1
    export RDMAXFER_RXE_DEVICES="rxe0 rxe1"
    export RDMAXFER_RXE_NETDEVS="veth0 veth1"
    export RDMAXFER_RXE_ADDRS="10.77.0.1 10.77.0.2"
    export RDMAXFER_GID_INDEX=1
    export RDMAXFER_RXE_RAILS=${RXE_RAILS:-1}
    if ((RDMAXFER_RXE_RAILS == 2)); then
        export RDMAXFER_RXE_RAIL_DEVICES="rxe0,rxe2 rxe1,rxe3"
    fi
    # Debian's pyverbs alone, for another CPython 3.11 (a venv's) to put on its sys.path
    # without all of /usr/lib/python3/dist-packages.
    if [[ -d /usr/lib/python3/dist-packages/pyverbs ]]; then
        mkdir -p /run/rxe-pyverbs
        ln -sfn /usr/lib/python3/dist-packages/pyverbs /run/rxe-pyverbs/pyverbs
        export RDMAXFER_PYVERBS_PATH=/run/rxe-pyverbs
    fi

    if [[ ${RXE_SETUP_ONLY:-0} == 1 ]]; then
        rdma link show
        ibv_devinfo | grep -E 'hca_id|state|active_mtu|link_layer'
        echo 0 > "$RUN_DIR/rc"
        return 0
    fi

    cd -- "$RXE_CWD"
    # Leave the VM a few seconds to report and power off before the host's timeout.
    local left=$((RXE_DEADLINE - $(date +%s) - 10))
    ((left > 5)) || left=5
    log "running (time limit ${left}s, cwd $PWD):${RXE_CMD[*]@Q}"
    rc=0
    timeout --kill-after=5 "$left" "${RXE_CMD[@]}" < /dev/null || rc=$?
    if ((rc == 124)); then
        log "command timed out after ${left}s"
    fi
    log "exit status $rc"
    echo "$rc" > "$RUN_DIR/rc"
}

inner 2>&1 | tee "$RXE_LOG"
rc=125
[[ -s $RUN_DIR/rc ]] && read -r rc < "$RUN_DIR/rc"
exit "$rc"

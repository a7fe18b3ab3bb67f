#!/usr/bin/env bash
# Checks the rxe test VM itself; run it inside the VM:
#
#   tests/rxe/run-in-vm.sh -- tests/rxe/selfcheck.sh
#
# 1. ibv_devinfo: rxe0 and rxe1 PORT_ACTIVE
# 2. ib_write_bw (64 KiB) and ib_write_lat (2 B) between rxe0 and rxe1 (perftest-ref.sh)
# 3. rdma_cm between the two addresses (rping)
# 4. pyverbs lists both devices from Debian's /usr/bin/python3, and from the caller's
#    `python3` (e.g. a venv's) through RDMAXFER_PYVERBS_PATH
# shellcheck disable=SC2329  # functions called indirectly (traps, check, wait_for)
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
fail=0
check() { # check NAME COMMAND...
    local name=$1 t0=$SECONDS
    shift
    if "$@"; then
        printf 'selfcheck: ok   %-28s (%ds)\n' "$name" $((SECONDS - t0))
    else
        printf 'selfcheck: FAIL %-28s (%ds)\n' "$name" $((SECONDS - t0))
        fail=1
    fi
}

devinfo() {
    local info dev
    info=$(timeout 30 ibv_devinfo)
    for dev in rxe0 rxe1; do
        awk -v d="$dev" '/hca_id:/ {cur = $2} cur == d && /state:/ && /PORT_ACTIVE/ {ok = 1}
            END {exit !ok}' <<< "$info" || { echo "$dev not PORT_ACTIVE"; return 1; }
    done
}

rping_check() {
    local pid rc=0
    timeout 30 rping -s -a 10.77.0.2 -C 3 > /dev/null 2>&1 &
    pid=$!
    sleep 2
    timeout 30 rping -c -a 10.77.0.2 -C 3 -v || rc=$?
    wait "$pid" || rc=$?
    return "$rc"
}

pyverbs_list() { # pyverbs_list PYTHON
    timeout 60 "$1" -c 'import sys, pyverbs.device as d
names = sorted(x.name.decode() if isinstance(x.name, bytes) else x.name for x in d.get_device_list())
print(sys.executable, sys.version.split()[0], names)
sys.exit(names != ["rxe0", "rxe1"])'
}

check "ibv_devinfo PORT_ACTIVE" devinfo
check "ib_write_bw 64 KiB" "$here/perftest-ref.sh" -n 200 -t bw 65536
check "ib_write_lat 2 B" "$here/perftest-ref.sh" -n 200 -t lat 2
check "rdma_cm (rping)" rping_check
check "pyverbs /usr/bin/python3" pyverbs_list /usr/bin/python3
py=$(command -v python3)
if [[ $py != /usr/bin/python3 ]]; then
    check "pyverbs $py" env PYTHONPATH="$RDMAXFER_PYVERBS_PATH${PYTHONPATH:+:$PYTHONPATH}" \
        bash -c "$(declare -f pyverbs_list); pyverbs_list $(printf '%q' "$py")"
fi
exit "$fail"

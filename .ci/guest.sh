#!/usr/bin/env bash
# CI's checks inside the rxe guest, in one boot (a boot under TCG costs about a minute, and
# each check's pytest start as much again): .ci/run starts it with
#   tests/rxe/run-in-vm.sh --rails 2 -- .ci/guest.sh
# after writing the test files each pytest run gets, one per line, to build/ci-guest/rdma-files
# and build/ci-guest/gpu-files. Each check's output is shown and kept in build/ci-guest/NAME.log,
# its exit status in NAME.rc; .ci/run judges them once the guest has exited. Every check runs
# whatever the one before it did, so one run shows every failure.
#   rdma   the RDMA suite (verbs and ofi) on two rails a side
#   gpu    GPU memory over verbs, through the stand-in CUDA driver
#   wheel  `rdmaxfer info` of the wheel built without the verbs headers (build/no-verbs-headers)
#   bench  a short rxe bench: rdmaxfer RDMA WRITE vs ib_write_bw/ib_write_lat, rxe0 -> rxe1
set -uo pipefail
cd "$(dirname "$0")/.."
out=build/ci-guest

check() { # check NAME CMD ARGS...
    local name=$1
    shift
    printf '\n---- guest: %s (%s)\n' "$name" "$(date -u +%H:%M:%S)"
    "$@" 2>&1 | tee "$out/$name.log"
    echo "${PIPESTATUS[0]}" > "$out/$name.rc"
}

mapfile -t rdma_files < "$out/rdma-files"
mapfile -t gpu_files < "$out/gpu-files"
# A test that failed because the guest's rxe NAKed one of our WRITEs as an invalid request
# (IBV_WC_REM_INV_REQ_ERR) runs once more: Debian 12's soft-RoCE did that once, mid-WRITE, to
# a valid 96 MiB WRITE on a loaded CI machine (the same test passed in every other run). A
# second failure fails CI, and any other failure fails it at once.
check rdma .venv/bin/python -m pytest -m "rdma and not gpu" "${rdma_files[@]}" -ra \
    -p no:cacheprovider --reruns 1 --only-rerun IBV_WC_REM_INV_REQ_ERR
check gpu .venv/bin/python -m pytest -m "gpu and rdma" "${gpu_files[@]}" -ra -p no:cacheprovider
check wheel build/no-verbs-headers/venv/bin/rdmaxfer info
# Two sizes, few iterations: under TCG emulation the table shows the layout and the ratios,
# not real speeds.
check bench .venv/bin/python -m rdmaxfer bench --transport rdma --op write --size 4K,64K \
    --iters 20 --warmup 2 --reference

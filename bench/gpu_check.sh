#!/usr/bin/env bash
# GPU check for a lent GPU machine (no network): build rdmaxfer, run the GPU tests
# (pytest -m gpu), the GPU bench (bench/gpu_bench.py: staged write/read against the pinned copy,
# 16 MiB to 4 GiB, and a 4 GiB GPU-to-GPU loopback send/recv), the two-process CUDA IPC bench
# (bench/gpu_ipc_bench.py: same GPU, and GPU 0 -> GPU 1 with two GPUs), load_weights of a
# LOAD_SIZE file into GPU memory with and without GPUDirect Storage against the disk's rate and
# a torch.load-style read-then-copy (bench/load_gpu_bench.py; cold page cache when root), TCP
# with TLS against plain TCP and a Python ssl socket pair on the machine's CPUs
# (bench/tls_bench.py, TLS_SIZE WRITEs), then (where Ray is installed or its wheel is in
# .whl/) GPU tensors between Ray actors over RDMAXFER (tests/test_ray.py -m gpu) and
# bench/ray_bench.py with CPU and CUDA tensors, then print one table of every check against
# its target (bench/gpu_check_table.py).
# The whole script stays under BUDGET seconds (default 470: under 8 minutes): each step's
# timeout is its own cap or what is left, whichever is smaller.
#
#   bench/gpu_check.sh              # from the repository root
#   BIG=1G SIZES=16M,256M IPC_SIZE=256M LOAD_SIZE=256M bench/gpu_check.sh   # a shorter run
#
# Offline installs: wheels in .whl/ (pybind11, scikit-build-core, cupy-cuda12x, pytest,
# numpy, ml_dtypes, safetensors...) are used when present; without CuPy the CuPy tests skip
# and the bench uses rdmaxfer's own device Buffers. Results land in $OUT (or /tmp) as JSON.
# Without a GPU, STANDIN=1 runs the same steps over the tests' stand-in driver
# (tests/_cuda_standin.py) to check the script itself; its figures mean nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=${OUT:-/tmp/rdmaxfer-gpu-check}
mkdir -p "$OUTDIR"
BUILD=${BUILD:-/tmp/rdmaxfer-gpu-build}
STAGE=${STAGE:-/tmp/rdmaxfer-gpu-stage}
SIZES=${SIZES:-16M,64M,256M,1G,4G}
BIG=${BIG:-4G}
IPC_SIZE=${IPC_SIZE:-1G}
LOAD_SIZE=${LOAD_SIZE:-1G}
LOAD_DIR=${LOAD_DIR:-/tmp}
TLS_SIZE=${TLS_SIZE:-1G}
BUDGET=${BUDGET:-470}
. bench/check_common.sh  # step, left, $PY, pip_offline, stage_build

step "machine"
nvidia-smi -L 2>&1 | head -8 || echo "nvidia-smi not found"
nvidia-smi topo -m 2>&1 | head -20 || true
nproc; free -g | head -2

step "python dependencies (offline)"
for mod in numpy ml_dtypes safetensors pytest pybind11 pycurl; do
  if ! $PY -c "import $mod" 2>/dev/null; then
    pip_offline "$mod" || echo "missing $mod and no .whl/ wheel for it"
  fi
done
if ! $PY -c "import cupy" 2>/dev/null; then
  pip_offline cupy-cuda12x || echo "no CuPy (no .whl/cupy_cuda12x wheel): CuPy parts skip"
fi
$PY -c "import cupy; print('cupy', cupy.__version__)" 2>/dev/null || true
if ! $PY -c "import ray" 2>/dev/null; then
  pip_offline ray || echo "no Ray (no .whl/ ray wheel): the Ray rows are SKIP"
fi

step "build (cmake, $BUILD)"
stage_build || exit 2
if [ "${STANDIN:-0}" = 1 ]; then
  RDMAXFER_CUDA_LIBRARY=$(cd "$ROOT/tests" && $PY -c "import _cuda_standin; print(_cuda_standin.library())")
  export RDMAXFER_CUDA_LIBRARY
  export RDMAXFER_CUFILE_LIBRARY=$RDMAXFER_CUDA_LIBRARY  # the stand-in holds a cuFile too
  echo "STANDIN=1: the stand-in driver $RDMAXFER_CUDA_LIBRARY (no GPU: figures mean nothing)"
fi

step "rdmaxfer info"
timeout "$(left 30)" $PY -m rdmaxfer info || true

step "GPU tests (pytest -m gpu)"
timeout "$(left 120)" $PY -m pytest "$ROOT/tests" -m gpu -q -rs -p no:cacheprovider -o addopts="" \
  --ignore="$ROOT/tests/test_ray.py" --junitxml="$OUTDIR/gpu-tests.xml" 2>&1 | tail -25
tests_rc=${PIPESTATUS[0]}

step "staging pipeline tests with the host copier (sanity on this machine)"
timeout "$(left 40)" $PY -m pytest "$ROOT/tests/test_staging.py" "$ROOT/tests/test_gpu_interop.py" -q \
  -p no:cacheprovider 2>&1 | tail -3

step "GPU bench"
timeout "$(left 220)" $PY "$ROOT/bench/gpu_bench.py" --sizes "$SIZES" --big "$BIG" \
  --json "$OUTDIR/gpu_bench.json"
bench_rc=$?

step "two processes through CUDA IPC (shm transport)"
timeout "$(left 60)" $PY "$ROOT/bench/gpu_ipc_bench.py" --size "$IPC_SIZE" \
  --json "$OUTDIR/gpu_ipc.json"
ipc_rc=$?

step "load_weights into GPU memory, GDS and not, vs the disk and read-then-copy ($LOAD_SIZE in $LOAD_DIR)"
timeout "$(left 120)" $PY "$ROOT/bench/load_gpu_bench.py" --size "$LOAD_SIZE" --dir "$LOAD_DIR" \
  --json "$OUTDIR/load_gpu.json"
load_rc=$?

step "TCP with TLS against plain TCP and Python ssl ($TLS_SIZE WRITEs, $(nproc) CPUs)"
timeout "$(left 120)" $PY "$ROOT/bench/tls_bench.py" --size "$TLS_SIZE" --rounds 3 \
  --json "$OUTDIR/tls_bench.json" 2>&1 | grep "^round\|Error\|error" | tail -8
tls_rc=${PIPESTATUS[0]}

step "Ray: GPU tensors over RDMAXFER between actors (pytest tests/test_ray.py -m gpu), then bench/ray_bench.py"
ray_rc=0
if $PY -c "import ray" 2>/dev/null; then
  timeout "$(left 150)" $PY -m pytest "$ROOT/tests/test_ray.py" -m gpu -q -rs -p no:cacheprovider \
    -o addopts="" --junitxml="$OUTDIR/ray-gpu-tests.xml" 2>&1 | tee "$OUTDIR/ray-gpu-tests.log" \
    | tail -8
  ray_rc=${PIPESTATUS[0]}
  devices=$($PY -c "import torch; print('cpu,cuda' if torch.cuda.is_available() else 'cpu')")
  timeout "$(left 200)" $PY "$ROOT/bench/ray_bench.py" --devices "$devices" --cpus "$(nproc)" \
    --rounds "${RAY_ROUNDS:-3}" --json "$OUTDIR/ray_bench.json" 2>&1 | grep -v "^20..-..-.. " | tail -8
  [ "${PIPESTATUS[0]}" -eq 0 ] || ray_rc=1
fi

step "done in $(( $(date +%s) - t0 ))s: gpu tests rc=$tests_rc, bench rc=$bench_rc, ipc rc=$ipc_rc, load rc=$load_rc, tls rc=$tls_rc, ray rc=$ray_rc (results in $OUTDIR)"
$PY "$ROOT/bench/gpu_check_table.py" "$OUTDIR"
table_rc=$?
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$ipc_rc" -eq 0 ] && [ "$load_rc" -eq 0 ] \
  && [ "$tls_rc" -eq 0 ] && [ "$ray_rc" -eq 0 ] && [ "$table_rc" -eq 0 ]

# What the one-command hardware checks (bench/gpu_check.sh, bench/efa_check.sh) share; sourced
# from the repository root with ROOT, OUTDIR, BUILD, STAGE and BUDGET set. Defines:
#   step TEXT      prints a step's heading with the seconds since the start
#   left CAP       a step's timeout: CAP seconds or what is left of BUDGET, at least 1
#   $PY            the python to use ($PYTHON, else .venv/bin/python, else python3)
#   pip_offline    pip install from the wheels in .whl/ (fails when there is none)
#   stage_build    cmake-builds the core (Release; at most BUILD_S seconds, default 200) into $BUILD and stages the package in
#                  $STAGE, put on PYTHONPATH; status 2 and a FAIL line when it cannot
t0=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - t0 ))s] $*"; }
# The timeout of a step: its cap ($1 seconds) or what is left of the budget, at least 1.
left() {
  local rest=$(( BUDGET - ($(date +%s) - t0) ))
  [ "$rest" -lt "$1" ] && echo $(( rest > 1 ? rest : 1 )) || echo "$1"
}

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in "$ROOT/.venv/bin/python" python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi
echo "python: $PY ($($PY --version 2>&1))"

pip_offline() {
  if [ -d "$ROOT/.whl" ]; then
    $PY -m pip install -q --no-index --find-links "$ROOT/.whl" "$@" 2>&1 | tail -2
  else
    return 1
  fi
}

stage_build() {
  PYBIND11_DIR=$($PY -c "import pybind11; print(pybind11.get_cmake_dir())" 2>/dev/null || true)
  if [ -z "$PYBIND11_DIR" ]; then
    echo "FAIL: pybind11 is not importable and no .whl/ wheel was found; carry one in .whl/"
    return 2
  fi
  local gen="" rc
  command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
  timeout "$(left 60)" cmake -S "$ROOT" -B "$BUILD" $gen -DCMAKE_BUILD_TYPE=Release \
    -Dpybind11_DIR="$PYBIND11_DIR" -DPython_EXECUTABLE="$(command -v $PY)" >"$OUTDIR/cmake.log" 2>&1 \
    && timeout "$(left "${BUILD_S:-200}")" cmake --build "$BUILD" -j "$(nproc)" >>"$OUTDIR/cmake.log" 2>&1
  rc=$?
  tail -3 "$OUTDIR/cmake.log"
  if [ $rc -ne 0 ]; then echo "FAIL: build (see $OUTDIR/cmake.log)"; return 2; fi
  rm -rf "$STAGE" && mkdir -p "$STAGE/rdmaxfer"
  cp -r "$ROOT"/python/rdmaxfer/. "$STAGE/rdmaxfer/"  # every subpackage, py.typed, _core.pyi
  cp "$BUILD"/_core*.so "$STAGE/rdmaxfer/"
  export PYTHONPATH="$STAGE"
}

#!/usr/bin/env bash
# EFA check for a machine with AWS EFA NICs (p4d, p5, ...): build rdmaxfer, show what libfabric
# offers (fi_info) and what `rdmaxfer doctor` finds (libfabric, its providers, NICs per GPU),
# run the ofi transport's cases over the efa provider between two of its domains
# (tests/rdma/ofi_cases.py: WRITE/READ bit-exact, a notified batch, SEND/RECV, the MiniLM file
# served and pulled bit-exact), bench WRITE bandwidth at 64 KiB, 1 MiB and 16 MiB against
# fabtests' fi_rma_bw over the same provider where installed (bench/ofi_bench.py), then print one
# table of every check against its target (bench/efa_check_table.py).
# The whole script stays under BUDGET seconds (default 900); results land in $OUT (or /tmp).
#
#   bench/efa_check.sh                              # from the repository root
#   DOMAINS="rdmap16s27-rdm rdmap32s27-rdm" ADDR=10.0.0.5 bench/efa_check.sh
#
# DOMAINS: the two libfabric domains the server and client engines open (default: the first two
# fi_info lists for the provider, or the first one twice); ADDR: the address the engines'
# bootstrap listens on (default 127.0.0.1). Both engines run on this one machine: libfabric's efa
# provider moves the bytes through the NIC (FI_EFA_ENABLE_SHM_TRANSFER=0 keeps its shm path
# out). PROVIDER="tcp;ofi_rxm" DOMAINS="lo lo" runs the same steps over libfabric's tcp provider
# on loopback to check the script itself on any machine; its figures mean nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=${OUT:-/tmp/rdmaxfer-efa-check}
mkdir -p "$OUTDIR"
BUILD=${BUILD:-/tmp/rdmaxfer-efa-build}
STAGE=${STAGE:-/tmp/rdmaxfer-efa-stage}
PROVIDER=${PROVIDER:-efa}
SIZES=${SIZES:-64K,1M,16M}
ADDR=${ADDR:-127.0.0.1}
BUDGET=${BUDGET:-900}
. bench/check_common.sh  # step, left, $PY, pip_offline, stage_build
export FI_EFA_ENABLE_SHM_TRANSFER=0

step "machine"
nproc; free -g | head -2
ls /sys/class/infiniband 2>/dev/null || echo "no RDMA devices in /sys/class/infiniband"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi topo -m 2>&1 | head -24; else echo "no nvidia-smi"; fi
if command -v fi_info >/dev/null 2>&1; then
  fi_info --version | head -3
  found=$(fi_info -p "$PROVIDER" -t FI_EP_RDM 2>/dev/null | awk '/domain:/ && !seen[$2]++ {print $2}')
  echo "$PROVIDER domains (FI_EP_RDM):" ${found:-none}
else
  found=""
  echo "fi_info not found (libfabric-bin / the EFA installer's /opt/amazon/efa/bin)"
fi
if [ -z "${DOMAINS:-}" ]; then
  first=$(echo "$found" | sed -n 1p)
  second=$(echo "$found" | sed -n 2p)
  DOMAINS="$first ${second:-$first}"
fi
read -r D0 D1 <<<"$DOMAINS"
if [ -z "${D0:-}" ]; then echo "FAIL: no $PROVIDER domain (set DOMAINS)"; exit 2; fi
echo "server on ${D1:-$D0}, client on $D0, bootstrap on $ADDR"
if [ "${PROVIDER%%;*}" = tcp ]; then export FI_TCP_IFACE=$D0; fi

step "python dependencies (offline)"
for mod in numpy ml_dtypes safetensors pytest pybind11; do
  if ! $PY -c "import $mod" 2>/dev/null; then
    pip_offline "$mod" || echo "missing $mod and no .whl/ wheel for it"
  fi
done

step "build (cmake, $BUILD)"
stage_build || exit 2

step "rdmaxfer doctor"
timeout "$(left 60)" $PY -m rdmaxfer doctor || true

step "ofi cases over $PROVIDER (tests/rdma/ofi_cases.py)"
RDMAXFER_TEST_OFI_PROVIDER=$PROVIDER RDMAXFER_RXE_DEVICES="$D0 ${D1:-$D0}" \
  RDMAXFER_RXE_ADDRS="$ADDR $ADDR" timeout "$(left 420)" $PY -m pytest "$ROOT/tests/rdma/ofi_cases.py" \
  -q -rs -p no:cacheprovider -o addopts="" --junitxml="$OUTDIR/ofi-cases.xml" 2>&1 | tail -15
tests_rc=${PIPESTATUS[0]}

step "WRITE bandwidth against fi_rma_bw ($SIZES)"
timeout "$(left 300)" $PY "$ROOT/bench/ofi_bench.py" --provider "$PROVIDER" --iface "$D0" \
  --sizes "$SIZES" --json "$OUTDIR/ofi_bench.json"
bench_rc=$?

step "done in $(( $(date +%s) - t0 ))s: ofi cases rc=$tests_rc, bench rc=$bench_rc (results in $OUTDIR)"
$PY "$ROOT/bench/efa_check_table.py" "$OUTDIR"
table_rc=$?
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$table_rc" -eq 0 ]

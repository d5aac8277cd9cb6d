#!/usr/bin/env bash
# Tensor-parallel check on a multi-GPU machine: the TP workloads (suites/tp) at TP-2 and TP-4 (where that
# many GPUs are visible), one process per GPU through torchrun and NCCL, every mode's output on every
# rank judged against the unsharded model, modes timed interleaved with CUDA events.
#
# usage (repository root): OUT=<dir> bash scripts/gpu/tp_check.sh [--modes inductor,pt2cg,grace]
#            [--workloads xlnet_tp,mlp_decode_tp] [--tier standard] [--samples 30] [--dtype float32]
#            [--sizes "2 4"] [--run-timeout-s 270]
#
# Writes $OUT/tp<N>/<workload>-tp<N>-cuda.json (format: suites/tp/results.py), $OUT/tp<N>.log,
# $OUT/environment.txt and $OUT/summary.txt. A TP size larger than the visible GPUs is skipped and said so.
# Each torchrun gets --run-timeout-s (a hung collective must not eat the whole lease).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-./out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

MODES="inductor,pt2cg,grace"; WORKLOADS="all"; TIER=standard; SAMPLES=30; DTYPE=float32; SIZES="2 4"
RUN_TIMEOUT=270
while [[ $# -gt 0 ]]; do
  case "$1" in
    --modes) MODES="$2"; shift 2 ;;
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --tier) TIER="$2"; shift 2 ;;
    --samples) SAMPLES="$2"; shift 2 ;;
    --dtype) DTYPE="$2"; shift 2 ;;
    --sizes) SIZES="$2"; shift 2 ;;
    --run-timeout-s) RUN_TIMEOUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "tp_check: unknown argument $1 (see --help)"; exit 2 ;;
  esac
done

# NVLink multicast must stay off on the lent machines: a program that uses it can put the host's GPUs,
# which others share, out of service for a day or more. Keep these exports whatever else changes here
# (torchrun passes them on to every rank).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # a failed collective ends the run instead of hanging it

CACHE="${GRACE_SUITES_CACHE:-$REPO/.cache}"  # compile caches, kept between calls on one machine
mkdir -p "$CACHE/inductor" "$CACHE/triton" "$CACHE/grace"
export TORCHINDUCTOR_CACHE_DIR="$CACHE/inductor" TRITON_CACHE_DIR="$CACHE/triton" GRACE_CACHE_DIR="$CACHE/grace"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
cd "$REPO" || exit 2

{
  git log -1 --format='commit %H %s' 2>/dev/null || true
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -n 20
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'gpus', torch.cuda.device_count())" 2>&1
  "$PY" -c "import grace; print('grace techniques', grace.available_techniques())" 2>&1
  env | grep -E '^(NCCL|NVSHMEM|TORCH_NCCL|TORCH_SYMM|CUDA_VISIBLE)' | sort
} > "$OUT/environment.txt"
cat "$OUT/environment.txt"

GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
echo "tp_check: $GPUS visible GPU(s); TP sizes wanted: $SIZES; modes $MODES; tier $TIER; samples $SAMPLES"
RC=0
for N in $SIZES; do
  if (( N > GPUS )); then
    echo "tp_check: TP-$N skipped: only $GPUS GPU(s) visible" | tee -a "$OUT/summary.txt"
    continue
  fi
  echo "tp_check: TP-$N starts"
  timeout -k 20 "$RUN_TIMEOUT" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$N" \
    -m suites.tp.run --workload "$WORKLOADS" --modes "$MODES" --device cuda --dtype "$DTYPE" \
    --tier "$TIER" --samples "$SAMPLES" --timeout-s "$((RUN_TIMEOUT - 30))" --out "$OUT/tp$N" \
    > "$OUT/tp$N.log" 2>&1
  STATUS=$?
  echo "tp_check: TP-$N exited $STATUS (124: timed out)" | tee -a "$OUT/summary.txt"
  (( STATUS != 0 )) && RC=1
  grep -v '^\s*$' "$OUT/tp$N.log" | grep -vE '^\[tp rank [1-9]' | tail -n 25
done

"$PY" - "$OUT" >> "$OUT/summary.txt" 2>&1 <<'PYEOF'
import sys
from pathlib import Path

from suites.tp.results import read_results

for path in sorted(Path(sys.argv[1]).glob("tp*/*.json")):
    data = read_results(path)
    timing = data["timing"]
    print(f"{path.name}: sharding {data['sharding']['status']}, timing {timing['status']} {timing['reason']}")
    for mode, result in data["modes"].items():
        median = timing["median_ms"].get(mode)
        vs_ind = timing["speedup_vs_inductor"].get(mode)
        vs_cg = timing["speedup_vs_pt2cg"].get(mode)
        figures = f" median {median:.3f} ms" if median is not None else ""
        figures += f", x{vs_ind:.2f} vs inductor" if vs_ind is not None else ""
        figures += f", x{vs_cg:.2f} vs pt2cg" if vs_cg is not None else ""
        print(f"  {mode:10s} {result['status']:14s}{figures}  {result['reason'][:160]}")
PYEOF
cat "$OUT/summary.txt"
exit $RC

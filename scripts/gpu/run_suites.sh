#!/usr/bin/env bash
# Run the correctness and performance suites (standard tier, every mode) on one GPU, record them into a
# SQLite store through the recorder, and bring back the store, its export, the report and the logs.
#
# usage: scripts/gpu/run_suites.sh [--part 1|2|train|all] [--workloads GLOBS] [--tier standard]
#                                  [--modes all] [--samples 30] [--budget-s 390] [--hard-limit-s 510]
#                                  [--cell current] [--label LABEL] [--grace-option KEY=VALUE]...
#                                  [--stall-dump-s 150]
#
#   --part 1|2     the two halves of the inference workload list (cheap ones first in each); default: all
#   --part train   the training workloads (*_train: one call is a forward, backward and optimizer step)
#   --workloads    comma list of name globs; overrides --part (e.g. the list in a previous remaining.txt)
#   --budget-s     no new workload starts after this many seconds of pytest (a started one finishes)
#   --grace-option a GraceOptions field for every grace mode (repeatable; recorded in the records'
#                  details): use another --label, so such runs do not merge with the default ones
#   --hard-limit-s pytest is interrupted (SIGINT: the recorder still closes its run) after this long;
#                  default budget + 120. The defaults fit a 600 s call; for a 300 s call use
#                  --budget-s 170 --hard-limit-s 250.
#   --stall-dump-s a test running longer than this prints every thread's Python stack to the log
#                  (pytest's faulthandler_timeout; the test goes on): where a stalled call waits. 0: off
#
# Resumable: a workload is recorded completely or not at all (unless the process dies inside it: then
# it is listed in $OUT/incomplete.txt); what did not run is listed in
# $OUT/remaining.txt and in the log, ready for the next call's --workloads. Compile caches (Inductor,
# Triton, grace decisions) and the store live under the repository's ignored .cache/ directory (or
# $GRACE_SUITES_CACHE), so a later call on the same machine reuses them. Everything it writes for the
# caller goes to $OUT.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$REPO/.cache/out/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run_suites.log") 2>&1

PART=all; WORKLOADS=""; TIER=standard; MODES=all; SAMPLES=30; BUDGET=390; HARD=""; CELL=current; LABEL=""
STALL=150
GRACE_OPTS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --part) PART="$2"; shift 2 ;;
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --tier) TIER="$2"; shift 2 ;;
    --modes) MODES="$2"; shift 2 ;;
    --samples) SAMPLES="$2"; shift 2 ;;
    --budget-s) BUDGET="$2"; shift 2 ;;
    --hard-limit-s) HARD="$2"; shift 2 ;;
    --cell) CELL="$2"; shift 2 ;;
    --label) LABEL="$2"; shift 2 ;;
    --grace-option) GRACE_OPTS+=(--grace-option "$2"); shift 2 ;;
    --stall-dump-s) STALL="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "run_suites: unknown argument $1 (see --help)"; exit 2 ;;
  esac
done
HARD="${HARD:-$((BUDGET + 120))}"

PART1="seed_elementwise_1m,elementwise_64x1m,linear8_cpu_scalar,cpu_position_ids,cpu_buffer_anchors,mlp"
PART1+=",pyhpc_equation_of_state,pyhpc_turbulent_kinetic_energy,nvidia_deeprecommender,dlrm"
PART1+=",llm_decode_static_kv,XLNetLMHeadModel,MT5ForConditionalGeneration"
PART2="speech_transformer,MobileBertForQuestionAnswering,DebertaV2ForQuestionAnswering"
PART2+=",DebertaForQuestionAnswering,BlenderbotSmallForConditionalGeneration,DistilGPT2"
PART2+=",lcnet_050,densenet121,alexnet,fasterrcnn_mobilenet_v3_large_320_fpn"
PART_TRAIN="nvidia_deeprecommender_train,dcgan_train,DistilGPT2_train,BertForMaskedLM_train"
PART_TRAIN+=",XLNetLMHeadModel_train,DebertaForMaskedLM_train,BlenderbotSmallForConditionalGeneration_train"
PART_TRAIN+=",MT5ForConditionalGeneration_train,DistilGPT2_train_amp,BertForMaskedLM_train_amp"
if [[ -z "$WORKLOADS" ]]; then
  case "$PART" in
    1) WORKLOADS="$PART1" ;;
    2) WORKLOADS="$PART2" ;;
    train) WORKLOADS="$PART_TRAIN" ;;
    all) WORKLOADS="*" ;;
    *) echo "run_suites: --part must be 1, 2, train or all"; exit 2 ;;
  esac
fi

CACHE="${GRACE_SUITES_CACHE:-$REPO/.cache}"  # compile caches and the store; kept between calls
mkdir -p "$CACHE/inductor" "$CACHE/triton" "$CACHE/grace" "$CACHE/store"
export TORCHINDUCTOR_CACHE_DIR="$CACHE/inductor"
export TRITON_CACHE_DIR="$CACHE/triton"
export GRACE_CACHE_DIR="$CACHE/grace"
export TORCHINDUCTOR_FX_GRAPH_CACHE=1
export PYTHONPATH="$REPO:$REPO/scripts/gpu${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export GRACE_SUITE_TIER="$TIER"
PY="${PYTHON:-python}"
DB_FILE="$CACHE/store/suites.sqlite"
DB="sqlite:///$DB_FILE"
RECORDS="$OUT/records.jsonl"
T0=$SECONDS
log() { echo "[run_suites +$((SECONDS - T0))s] $*"; }

log "repo $REPO, out $OUT, tier $TIER, modes $MODES, samples $SAMPLES, budget ${BUDGET}s, hard limit ${HARD}s"
log "workloads: $WORKLOADS"
cd "$REPO" || exit 2
git log -1 --format='commit %H %s' 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 | tee "$OUT/nvidia-smi.csv"

"$PY" - > "$OUT/environment.json" 2> "$OUT/environment.err" <<'PYEOF'
import importlib, json, platform, sys
info = {"python": sys.version.split()[0], "platform": platform.platform()}
for name in ("torch", "triton", "transformers", "timm", "torchvision", "numpy", "sqlalchemy"):
    try:
        info[name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as exc:
        info[name] = f"unavailable: {type(exc).__name__}: {exc}"[:300]
try:
    import torch
    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda_runtime"] = torch.version.cuda
        import torch._inductor.config as c
        info["inductor_graph_partition"] = getattr(c, "graph_partition", "absent")
except Exception as exc:
    info["torch_error"] = repr(exc)
try:
    import grace
    info["grace_techniques"] = grace.available_techniques()
except Exception as exc:
    info["grace_techniques"] = f"unavailable: {type(exc).__name__}: {exc}"[:300]
try:
    from suites.modes import Mode, unavailable_reason
    info["modes"] = {m.value: unavailable_reason(m, "cuda") for m in Mode}
except Exception as exc:
    info["modes"] = repr(exc)
print(json.dumps(info, indent=2, default=str))
PYEOF
cat "$OUT/environment.json" "$OUT/environment.err"

RECORDER=()
if "$PY" -c "import matrix.recorder" 2> "$OUT/recorder-import.err"; then
  RECORDER=(-p matrix.recorder "--grace-matrix-db=$DB" "--grace-matrix-cell=$CELL")
  [[ -n "$LABEL" ]] && RECORDER+=("--grace-matrix-label=$LABEL")
  log "recording into $DB (cell $CELL)"
else
  log "WARNING: matrix.recorder cannot be imported; records go to $RECORDS only:"
  cat "$OUT/recorder-import.err"
fi

log "pytest starts"
timeout -s INT -k 30 "$HARD" "$PY" -m pytest suites/test_correctness.py suites/test_performance.py \
  --tier "$TIER" --modes "$MODES" --workloads "$WORKLOADS" --perf-samples "$SAMPLES" "${GRACE_OPTS[@]}" \
  --time-budget-s "$BUDGET" -p record_jsonl --record-jsonl "$RECORDS" "${RECORDER[@]}" \
  -p no:cacheprovider -o console_output_style=classic -o "faulthandler_timeout=$STALL" -rfEs -v \
  --log-level=WARNING --durations=25 --junitxml "$OUT/junit.xml"
RC=$?
log "pytest exited $RC (0: all passed, 1: some failed: see the records; 124/130: interrupted at the hard limit)"

log "post-processing: store copy, export, report, remaining workloads"
"$PY" "$REPO/scripts/gpu/suites_post.py" --db "$DB" --records "$RECORDS" --out "$OUT" --workloads "$WORKLOADS"
log "post-processing exited $?"
ls -la "$OUT"
log "done"
if [[ $RC -eq 0 || $RC -eq 1 ]]; then exit 0; fi
exit "$RC"

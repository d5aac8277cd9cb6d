#!/usr/bin/env bash
# One GPU lease call: bring the store's dependencies (wheels carried beside the tree, no network there),
# then run the steps named on the command line, each under its own time limit, logging to $OUT.
#
# usage: scripts/gpu/session.sh STEP[:SECONDS] ... [-- run_suites.sh arguments]
#   gpu-tests   pytest -m gpu over tests/ or $GRACE_GPU_TESTS (runtime, capture, PI and CGCT device tests)
#   cgct        scripts/gpu/cgct_check.py $GRACE_CGCT_ARGS (kernels in graphs, with and without partitions)
#   pi          scripts/gpu/pi_gpu_check.py (PI numerics after moves, bytes per replay, timing)
#   repro       scripts/gpu/repro_linears.py (repeated capture of the CPU-scalar model, every call vs eager)
#   probe       scripts/gpu/probe.py $GRACE_PROBE_ARGS (peak memory per call and mode, host time per call)
#   trainmem    scripts/gpu/train_memory.py $GRACE_TRAINMEM_ARGS (a training step's memory, phase by phase)
#   trainhost   scripts/gpu/train_host.py $GRACE_TRAINHOST_ARGS (a steady training step's host time per
#               mode, interleaved, and a cProfile of grace's runners)
#   profhang    scripts/gpu/profile_hang.py $GRACE_PROFHANG_ARGS (a training step under the profiler, each
#               case in its own process with a time limit: which settings hang)
#   writes      scripts/gpu/write_probe.py $GRACE_WRITES_ARGS (which mode sequence makes a training backward
#               under grace write its saved tensors, with every Inductor lowering's donated inputs)
#   layers      scripts/gpu/host_layers.py (a captured call's host time layer by layer, against a raw replay)
#   steps       scripts/gpu/runner_steps.py (each step of a steady runner call timed on its own)
#   timeline    scripts/gpu/call_timeline.py $GRACE_TIMELINE_ARGS (a synchronised call's device timeline)
#   harness     scripts/gpu/harness.py $GRACE_HARNESS_ARGS (PyTorch's dynamo benchmark harness, the copy
#               at $GRACE_HARNESS_DIR, default .carry/harness/torch-<major.minor>: each model, mode
#               and backend in its own process with a time limit, the harness's CSVs and logs under
#               harness/; default DistillGPT2 and MobileBertForMaskedLM, --accuracy --inference and
#               --accuracy --training --amp, grace and inductor)
#   suites      scripts/gpu/run_suites.sh with the arguments after --
#   head        the next part of the head run at $GRACE_MATRIX_GIT_SHA (a full commit id): what
#               scripts/gpu/head_plan.py finds missing in the exports under results/head/ (or
#               $GRACE_HEAD_EXPORTS, a folder), run with label head-<sha[:12]> within SECONDS (the
#               suites stop starting workloads 150 s before); commit the call's suites-export.jsonl as
#               results/head/head-<sha[:12]>-<n>.jsonl and call again until the step says complete
#               ($GRACE_HEAD_SAMPLES timed samples, default 30)
#   fuzz        the differential fuzzer (pytest suites/fuzz -m fuzz) for SECONDS less 90 (start-up, the
#               last case, the export), recorded into its own store: fuzz-export.jsonl (the fuzz record
#               with its counts and failing schedules), fuzz/counts.json, fuzz/records.jsonl; fuzz:400
#               gives 310 s of schedules
# Everything lands in one bundle.tar.gz (plus the store export and the log) in $OUT.
# Wheels: a directory named by $GRACE_WHEELS (default: .carry/wheels) holding SQLAlchemy, Alembic and
# Mako for the device's Python; skipped when those import already.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BACK="${OUT:-$REPO/.cache/back}"  # what the caller gets: the bundle and the export
OUT="$REPO/.cache/out/$(date -u +%Y%m%dT%H%M%SZ)"  # everything the steps write
mkdir -p "$OUT" "$BACK"
cd "$REPO" || exit 2
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR="$REPO/.cache/inductor" TRITON_CACHE_DIR="$REPO/.cache/triton"
export GRACE_CACHE_DIR="$REPO/.cache/grace"
T0=$SECONDS
log() { echo "[session +$((SECONDS - T0))s] $*"; }

if ! python -c "import sqlalchemy, alembic" 2>/dev/null; then
  WHEELS="${GRACE_WHEELS:-$REPO/.carry/wheels}"
  log "installing the store's dependencies from $WHEELS"
  python -m pip install --quiet --no-index --find-links "$WHEELS" sqlalchemy alembic mako || log "install failed"
fi

# One part of the head run (step head): plan from the exports so far, then run what is missing.
head_part() {
  local limit="$1" sha="${GRACE_MATRIX_GIT_SHA:-}" exports=() next=() plan rc
  local folder="${GRACE_HEAD_EXPORTS:-$REPO/results/head}"
  [[ -d "$folder" ]] && mapfile -t exports < <(find "$folder" -maxdepth 1 -name '*.jsonl' | sort)
  plan="$(python scripts/gpu/head_plan.py --sha "$sha" --next-args "${exports[@]}")"
  rc=$?
  if [[ $rc -eq 3 ]]; then log "head run at $sha: complete (${#exports[@]} part(s))"; return 0; fi
  [[ $rc -ne 0 ]] && return "$rc"
  mapfile -t next <<<"$plan"
  log "head run at $sha: ${#exports[@]} part(s) so far; next: ${next[*]}"
  OUT="$OUT" bash scripts/gpu/run_suites.sh "${next[@]}" \
    --samples "${GRACE_HEAD_SAMPLES:-30}" --budget-s "$((limit > 240 ? limit - 150 : limit / 3))" \
    --hard-limit-s "$((limit > 120 ? limit - 60 : limit / 2))"
}

STEPS=()
while [[ $# -gt 0 && "$1" != "--" ]]; do STEPS+=("$1"); shift; done
[[ "${1:-}" == "--" ]] && shift
SUITE_ARGS=("$@")

for spec in "${STEPS[@]}"; do
  step="${spec%%:*}"; limit="${spec#*:}"; [[ "$limit" == "$spec" ]] && limit=300
  log "step $step (limit ${limit}s)"
  case "$step" in
    gpu-tests)
      GRACE_TEST_ARTIFACTS="$OUT/gpu-tests" timeout -s INT -k 20 "$limit" \
        python -m pytest ${GRACE_GPU_TESTS:-tests} -m gpu -q -rfEs -p no:cacheprovider \
        --junitxml "$OUT/gpu-tests.xml"
      rc=$?
      sed -i "s#$REPO/##g" "$OUT/gpu-tests.xml" 2>/dev/null  # paths relative to the repository
      (exit $rc) ;;
    cgct)
      # shellcheck disable=SC2086  # GRACE_CGCT_ARGS holds several words on purpose
      OUT="$OUT" timeout -s INT -k 20 "$limit" python scripts/gpu/cgct_check.py ${GRACE_CGCT_ARGS:-} ;;
    pi)
      timeout -s INT -k 20 "$limit" python scripts/gpu/pi_gpu_check.py --out "$OUT/pi" \
        --deadline-s "$((limit - 30))" ;;
    repro)
      timeout -s INT -k 20 "$limit" python scripts/gpu/repro_linears.py --trials 500 --out "$OUT/repro" \
        --deadline-s "$((limit - 30))" ;;
    probe)
      # shellcheck disable=SC2086  # GRACE_PROBE_ARGS holds several words on purpose
      timeout -s INT -k 20 "$limit" python scripts/gpu/probe.py --out "$OUT/probe" \
        --deadline-s "$((limit - 40))" ${GRACE_PROBE_ARGS:-} ;;
    trainmem)
      # shellcheck disable=SC2086  # GRACE_TRAINMEM_ARGS holds several words on purpose
      timeout -s INT -k 20 "$limit" python scripts/gpu/train_memory.py --out "$OUT/trainmem" \
        --deadline-s "$((limit - 40))" ${GRACE_TRAINMEM_ARGS:-} ;;
    trainhost)
      # shellcheck disable=SC2086  # GRACE_TRAINHOST_ARGS holds several words on purpose
      timeout -s INT -k 20 "$limit" python scripts/gpu/train_host.py --out "$OUT/trainhost" \
        --deadline-s "$((limit - 60))" ${GRACE_TRAINHOST_ARGS:-} ;;
    profhang)
      # shellcheck disable=SC2086  # GRACE_PROFHANG_ARGS holds several words on purpose
      timeout -s INT -k 20 "$limit" python scripts/gpu/profile_hang.py --out "$OUT/profhang" \
        ${GRACE_PROFHANG_ARGS:-} ;;
    layers)
      timeout -s INT -k 20 "$limit" python scripts/gpu/host_layers.py --out "$OUT/layers" ;;
    steps)
      timeout -s INT -k 20 "$limit" python scripts/gpu/runner_steps.py --out "$OUT/steps" ;;
    timeline)
      # shellcheck disable=SC2086  # GRACE_TIMELINE_ARGS holds several words on purpose
      timeout -s INT -k 20 "$limit" python scripts/gpu/call_timeline.py --out "$OUT/timeline" \
        ${GRACE_TIMELINE_ARGS:-} ;;
    harness)
      # shellcheck disable=SC2086  # GRACE_HARNESS_ARGS holds several words on purpose
      timeout -s INT -k 20 "$limit" python scripts/gpu/harness.py --out "$OUT/harness" \
        --deadline-s "$((limit > 600 ? limit - 300 : limit / 2))" ${GRACE_HARNESS_ARGS:-}
      rc=$?
      # paths relative to the repository, as in gpu-tests.xml (the hub cache's seeded configs hold none)
      find "$OUT/harness" -type f \( -name '*.json' -o -name '*.csv' -o -name '*.log' \) ! -path '*/hf-hub/*' \
        -exec sed -i "s#$REPO/##g" {} + 2>/dev/null
      (exit $rc) ;;
    suites)
      OUT="$OUT" bash scripts/gpu/run_suites.sh "${SUITE_ARGS[@]}" ;;
    head)
      head_part "$limit" ;;
    writes)
      # shellcheck disable=SC2086  # GRACE_WRITES_ARGS holds several words on purpose
      timeout -s INT -k 20 "$limit" python scripts/gpu/write_probe.py --out "$OUT/writes" ${GRACE_WRITES_ARGS:-} ;;
    fuzz)
      mkdir -p "$OUT/fuzz"
      FUZZ_DB="sqlite:///$OUT/fuzz/store.sqlite"
      GRACE_FUZZ_SECONDS="$((limit > 180 ? limit - 90 : limit / 2))" PYTHONPATH="$REPO/scripts/gpu:$PYTHONPATH" \
        timeout -s INT -k 20 "$limit" python -m pytest suites/fuzz -m fuzz -q -rfEs -p no:cacheprovider \
        -p matrix.recorder "--grace-matrix-db=$FUZZ_DB" --grace-matrix-cell=current \
        ${GRACE_FUZZ_LABEL:+"--grace-matrix-label=$GRACE_FUZZ_LABEL"} \
        -p record_jsonl --record-jsonl "$OUT/fuzz/records.jsonl" --junitxml "$OUT/fuzz/junit.xml"
      log "fuzz pytest exited $?"
      python -m matrix_cli export --db "$FUZZ_DB" -o "$OUT/fuzz-export.jsonl"
      python - "$OUT/fuzz/records.jsonl" > "$OUT/fuzz/counts.json" <<'PYEOF'
import json, os, sys
records = [json.loads(line)["record"] for line in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
fuzz = [r for r in records if r.get("workload", {}).get("name") == "fuzz"]
print(json.dumps([{"status": r["status"], "reason": r.get("reason"), **r.get("errors", {}),
                   "base_seed": r["details"].get("base_seed"), "seconds": r["details"].get("seconds")}
                  for r in fuzz], indent=2))
PYEOF
      cat "$OUT/fuzz/counts.json" ;;
    *) log "unknown step $step" ;;
  esac
  log "step $step exited $?"
done
log "done; bundling $OUT"
tar -czf "$BACK/bundle.tar.gz" -C "$OUT" . && cp "$OUT"/*export*.jsonl "$BACK"/ 2>/dev/null
cp "$OUT/session.log" "$BACK/session.log"
ls -la "$BACK"

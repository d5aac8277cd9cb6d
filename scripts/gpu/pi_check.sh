#!/usr/bin/env bash
# GPU validation of parameter indirection, one lease, everything batched:
#   1. scripts/gpu/pi_gpu_check.py: PI numerics at moved inputs on the suite workloads and a bf16 matmul
#      (vendor path), bytes per replay, timing on the 64x1M workload (and more while time is left);
#   2. tests/test_pi_gpu.py: the gpu-marked PI tests (pointer table, moved/misaligned/mutated inputs,
#      vendor path);
#   3. suites/test_pi_stages.py: the PI stage suite with its GPU stages (load, patch, numeric), records
#      written to pi_records.jsonl.
# Usage (repository root, one CUDA device): OUT=<dir> bash scripts/gpu/pi_check.sh
set -u
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export PYTHONPATH="$(pwd):$(pwd)/scripts/gpu${PYTHONPATH:+:$PYTHONPATH}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python -c "import cuda.bindings as b; print('cuda-bindings', b.__version__)" 2>&1
  python -c "import grace; print('techniques', grace.available_techniques())" 2>&1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

timeout "${CHECK_TIMEOUT:-165}" python scripts/gpu/pi_gpu_check.py --out "$OUT" --deadline-s "${CHECK_DEADLINE:-110}" \
  > "$OUT/pi_gpu.log" 2>&1
echo "pi_gpu_check rc=$?"
grep -E "^(numerics|timing)" "$OUT/pi_gpu.log" | cut -c1-400

timeout "${TESTS_TIMEOUT:-60}" python -m pytest -m gpu tests/test_pi_gpu.py -q -p no:cacheprovider -x --tb=short \
  > "$OUT/pi_gpu_tests.log" 2>&1
echo "gpu tests rc=$?"
grep -E "passed|failed|error|Error|assert" "$OUT/pi_gpu_tests.log" | tail -n 15

timeout "${SUITE_TIMEOUT:-55}" python -m pytest -q -p no:cacheprovider -p record_jsonl \
  --record-jsonl "$OUT/pi_records.jsonl" suites/test_pi_stages.py > "$OUT/pi_stages.log" 2>&1
echo "pi stage suite rc=$?"
tail -n 5 "$OUT/pi_stages.log"
python - "$OUT/pi_records.jsonl" <<'PY' 2>/dev/null
import collections, json, sys
counts = collections.Counter()
for line in open(sys.argv[1]):
    r = json.loads(line)["record"]
    counts[(r["stage"], r["status"])] += 1
print(sorted(counts.items()))
PY

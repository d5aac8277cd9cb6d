#!/usr/bin/env bash
# GPU validation of the grace runtime: the gpu-marked runtime tests, then a focused timing check.
# Usage (repository root, one CUDA device): OUT=<dir> bash scripts/gpu/runtime_check.sh
set -u
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python -c "import grace; print('techniques', grace.available_techniques())"
  python -c "import cuda.bindings as b; print('cuda-bindings', b.__version__)" 2>&1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

timeout "${TIMING_TIMEOUT:-110}" python scripts/gpu/runtime_timing.py --out "$OUT" > "$OUT/timing.log" 2>&1
echo "timing rc=$?"
tail -n 8 "$OUT/timing.log"

GRACE_TEST_ARTIFACTS="$OUT/stats" timeout "${TESTS_TIMEOUT:-170}" python -m pytest -m gpu tests/test_capture_gpu.py -q -p no:cacheprovider \
  --junitxml="$OUT/junit.xml" > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$?"
grep -E "passed|failed|error|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -n 40

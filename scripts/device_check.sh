#!/usr/bin/env bash
# On a CUDA machine, from the checkout: the whole test suite (GPU tests included) and the demo on
# the GPU. Full logs go under $OUT (default /tmp/torch_fp4_check); a short summary prints last.
set -uo pipefail
OUT=${OUT:-/tmp/torch_fp4_check}
mkdir -p "$OUT"
# nvidia-cutlass-dsl travels in .carry (see ../shared/tools/pack-cutlass-dsl); optional.
[ -f .carry/device-env.sh ] && source .carry/device-env.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PYTEST_ARGS=${PYTEST_ARGS:-tests}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
python3 -m pytest -q $PYTEST_ARGS -p no:cacheprovider -rfEs > "$OUT/pytest.log" 2>&1
test_rc=$?
python3 -m pytest -q $PYTEST_ARGS -p no:cacheprovider -m gpu -rs > "$OUT/pytest_gpu.log" 2>&1
python3 -m torch_fp4 demo > "$OUT/demo.log" 2> "$OUT/demo.err"
demo_rc=$?
echo "== failures (if any)"; grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20
echo "== skipped GPU tests (reasons)"; grep -E "^SKIPPED" "$OUT/pytest_gpu.log" | sed 's/^SKIPPED \[[0-9]*\] //' | sort | uniq -c | head -10
echo "== demo"; cat "$OUT/demo.log"; [ "$demo_rc" -eq 0 ] || tail -20 "$OUT/demo.err"
echo "== summary"
cat "$OUT/gpu.txt"
echo "all tests: $(tail -1 "$OUT/pytest.log") (exit $test_rc)"
echo "gpu tests: $(tail -1 "$OUT/pytest_gpu.log")"
echo "demo exit: $demo_rc"

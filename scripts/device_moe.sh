#!/usr/bin/env bash
# fused_moe on the GPU: GPU tests, kernel-time profile, `bench moe` (quick or full).
# Usage: scripts/device_moe.sh [tests] [profile] [sweep] [quick|full]   (writes under $OUT)
source "$(dirname "$0")/device_common.sh"
for step in "$@"; do
  case $step in
    tests) timeout ${TEST_TIMEOUT:-900} python -m pytest -q -rs ${PYTEST_ARGS:-tests/test_gpu_moe.py} ${PYTEST_K:+-k "$PYTEST_K"} > "$OUT/tests.txt" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.txt" | tail -15 ;;
    profile) timeout 300 python scripts/profile_moe.py ${PROFILE_T:-1 16 4096} 2>&1 | tee "$OUT/profile.txt" | cut -c1-400 ;;
    quick) python -m torch_fp4 bench moe --quick --csv "$OUT/moe_quick.csv" > "$OUT/moe_quick.txt" 2>&1; cat "$OUT/moe_quick.txt" ;;
    full) python -m torch_fp4 bench moe --csv "$OUT/moe_full.csv" > "$OUT/moe_full.txt" 2>&1; cat "$OUT/moe_full.txt" ;;
    sweep) timeout 540 python scripts/sweep_moe.py ${SWEEP_T:-1 16} 2>&1 | tee "$OUT/sweep.txt" ;;
  esac
done

#!/usr/bin/env bash
# mm_fp4 on the GPU: GPU tests, then `bench mm` (quick grid or full) and tactic sweeps.
# Usage: scripts/device_mm.sh [tests] [quick|full] [ncu] [tactics]   (writes under $OUT)
# TACTIC_PROBLEMS="1_w4a16 16_w4a16" limits the tactic sweeps (M_mode, N=8192 K=28672).
source "$(dirname "$0")/device_common.sh"
for step in "$@"; do
  case $step in
    tests) timeout ${TEST_TIMEOUT:-900} python -m pytest -q -x -rs ${PYTEST_ARGS:-tests/test_gpu_mm.py} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tail -25 | tee "$OUT/tests.txt" ;;
    quick) python -m torch_fp4 bench mm --quick --csv "$OUT/mm_quick.csv" 2>&1 | tee "$OUT/mm_quick.txt" ;;
    full) python -m torch_fp4 bench mm --csv "$OUT/mm_full.csv" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/mm_full.txt" ;;
    ncu) ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
           -k regex:_mm_kernel -s 1 -c 1 python scripts/ncu_mm.py 16 8192 28672 > "$OUT/ncu.txt" 2>&1
         grep -E "Throughput|Duration|Occupancy|Registers|Stall|Block Limit|Warp Cycles|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu.txt" | head -40 ;;
    tactics)
      for mk in ${TACTIC_PROBLEMS:-1_w4a16 16_w4a16 128_w4a16 2048_w4a16 16_w4a4 128_w4a4}; do
        set -- ${mk/_/ }
        echo "== M=$1 $2 N=8192 K=28672" >> "$OUT/tactics.txt"
        timeout 300 python -m torch_fp4 bench mm --tactics --m $1 --mode $2 >> "$OUT/tactics.txt" 2>&1
      done ;;
  esac
done

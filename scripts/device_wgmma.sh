#!/usr/bin/env bash
# The Hopper wgmma GEMM on the GPU: its tests, then `bench mm` over chosen M (with quack when
# carried). Usage: scripts/device_wgmma.sh [tests] [bench] [tactics]   (writes under $OUT)
# MS="64,128,256" picks the bench's M values; PYTEST_K filters the tests.
source "$(dirname "$0")/device_common.sh"
for step in "$@"; do
  case $step in
    build) python -c "import torch; from torch_fp4.kernels.cuda.build import extension; extension(torch.device('cuda'))" 2>&1 | tail -20 | tee "$OUT/build.txt" ;;
    tests) timeout ${TEST_TIMEOUT:-400} python -m pytest -q -x -rs ${PYTEST_ARGS:-tests/test_gpu_mm_wgmma.py} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tail -25 | tee "$OUT/tests.txt" ;;
    wide) timeout ${BENCH_TIMEOUT:-400} python -c "
import torch_fp4.tuning as T; T.HOPPER_MM_MS = (17, 1 << 30)   # the wgmma GEMM for every M > 16
from torch_fp4.bench import mm; mm.run(csv_path='$OUT/mm_wide.csv', ms=tuple(int(v) for v in '${MS:-64,128,256,1024,4096}'.split(',')))
" 2>&1 | tee "$OUT/mm_wide.txt" ;;
    bench) timeout ${BENCH_TIMEOUT:-400} python -m torch_fp4 bench mm --ms "${MS:-1,16,64,128,256,1024,4096}" --csv "$OUT/mm.csv" 2>&1 | tee "$OUT/mm.txt" ;;
    tactics)
      for mm in ${TACTIC_MS:-64 128 256}; do
        echo "== M=$mm W4A16 N=8192 K=28672" >> "$OUT/tactics.txt"
        timeout 200 python -m torch_fp4 bench mm --tactics --m $mm --mode w4a16 >> "$OUT/tactics.txt" 2>&1
      done; grep -E "==|wgmma" "$OUT/tactics.txt" | sort -k2 -n | head -60 ;;
    ncu) ncu --clock-control none --metrics sm__inst_issued.avg.per_cycle_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warp_latency_issue_stalled_barrier,smsp__warp_issue_stalled_wait_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct,smsp__warp_issue_stalled_membar_per_warp_active.pct,gpu__time_duration.sum \
           -k regex:wgmma_mm_kernel -s 1 -c 1 python scripts/ncu_mm.py ${NCU_M:-1024} 8192 28672 > "$OUT/ncu.txt" 2>&1
         grep -E "sm__|dram__|smsp__|gpu__time" "$OUT/ncu.txt" | head -20 ;;
  esac
done

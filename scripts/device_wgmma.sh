#!/usr/bin/env bash
# The Hopper wgmma GEMM on the GPU: its tests, then `bench mm` over chosen M (with quack when
# carried). Usage: scripts/device_wgmma.sh [build] [tests] [bench] [tactics] [ncu]   (writes under $OUT)
# MS="64,128,256" picks the bench's M values; PYTEST_K filters the tests; SWEEP_MS, SWEEP_SHAPES
# ("NxK ...") and SWEEP_ARGS (e.g. --near-default) steer the tactic sweep.
source "$(dirname "$0")/device_common.sh"
for step in "$@"; do
  case $step in
    build) python -c "import torch; from torch_fp4.kernels.cuda.native import load_all; load_all(torch.cuda.current_device())" 2>&1 | tail -20 | tee "$OUT/build.txt" ;;
    tests) timeout ${TEST_TIMEOUT:-400} python -m pytest -q -x -rs ${PYTEST_ARGS:-tests/test_gpu_mm_wgmma.py} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tail -25 | tee "$OUT/tests.txt" ;;
    wide) timeout ${BENCH_TIMEOUT:-400} python -c "
import torch_fp4.tuning as T; T.HOPPER_MM_MS = (17, 1 << 30)   # the wgmma GEMM for every M > 16
from torch_fp4.bench import mm; mm.run(csv_path='$OUT/mm_wide.csv', ms=tuple(int(v) for v in '${MS:-64,128,256,1024,4096}'.split(',')))
" 2>&1 | tee "$OUT/mm_wide.txt" ;;
    bench) timeout ${BENCH_TIMEOUT:-400} python -m torch_fp4 bench mm --ms "${MS:-1,16,64,128,256,1024,4096}" --csv "$OUT/mm.csv" 2>&1 | tee "$OUT/mm.txt" ;;
    tactics) for shape in ${SWEEP_SHAPES:-8192x28672}; do
               timeout ${SWEEP_TIMEOUT:-300} python scripts/sweep_wgmma.py "${SWEEP_MS:-64,128,256,1024}" ${shape/x/ } \
                 ${SWEEP_ARGS:-} 2>&1 | tee -a "$OUT/sweep.txt" | grep -A${SWEEP_TOP:-4} "=="
             done ;;
    ncu) for mm in ${NCU_MS:-64 1024}; do
           ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
             --section ComputeWorkloadAnalysis --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed \
             -k regex:wgmma_mm_kernel -s 1 -c 1 python scripts/ncu_mm.py $mm 8192 28672 wgmma > "$OUT/ncu_$mm.txt" 2>&1
           echo "== M=$mm"; grep -E "Duration|Throughput|hmma|lts__t_bytes|wavefronts|Stall|Issue Slots|Issued Ipc|Eligible|Active Warps|L2 Hit|Warp Cycles Per Issued" "$OUT/ncu_$mm.txt" | head -30
         done ;;
  esac
done

#!/usr/bin/env bash
# The open issues' target measurements on the lent GPU, in parts that each fit one device call:
#   scripts/device_targets.sh [build] [mm] [moe] [gpt-oss] [overhead] [tier] [sanitize]   (CSVs and logs under $OUT)
# build: `precompile` (every kernel library, and the Triton kernels of the default shapes) so that
# the later parts time kernels, not compilers; mm: `bench mm` at M = 1..4096 on the three
# Llama-3.1-70B shapes with quack and fp8 in the same run (issue 12); moe: `bench moe` on
# Mixtral-8x7B, Qwen3-30B-A3B and DeepSeek-V3 at T = 1..4096, row-major and "sm90" experts
# (issue 13); gpt-oss: the gpt-oss shapes (issue 16); overhead: `bench overhead` twice (issue 18);
# tier: the quick GPU test tier as README runs it, timed, with its slowest tests (its workers make
# the session build the cuda libraries first, in parallel); sanitize: initcheck over the triton
# mm_fp4 cases, one format per sanitizer process (issue 14).
source "$(dirname "$0")/device_common.sh"
t0=$(date +%s)
for step in "$@"; do
  case $step in
    build) timeout ${BUILD_TIMEOUT:-300} python -m torch_fp4 precompile > "$OUT/precompile.log" 2>&1
           echo "precompile rc $? $(( $(date +%s) - t0 ))s: $(tail -1 "$OUT/precompile.log")" ;;
    mm) timeout ${MM_TIMEOUT:-500} python -m torch_fp4 bench mm --ms ${MS:-1,16,32,64,128,256,1024,4096} \
          --csv "$OUT/mm.csv" > "$OUT/mm.log" 2>&1
        echo "bench mm rc $? $(( $(date +%s) - t0 ))s"; grep -v Warn "$OUT/mm.log" | tail -30 ;;
    moe) timeout ${MOE_TIMEOUT:-500} python -m torch_fp4 bench moe --tokens ${TOKENS:-1,4,16,64,256,1024,4096} \
           --models Mixtral-8x7B,Qwen3-30B-A3B,DeepSeek-V3 --csv "$OUT/moe.csv" > "$OUT/moe.log" 2>&1
         echo "bench moe rc $? $(( $(date +%s) - t0 ))s"; grep -v Warn "$OUT/moe.log" ;;
    gpt-oss) timeout ${MOE_TIMEOUT:-500} python -m torch_fp4 bench moe --tokens ${TOKENS:-1,16,256,4096} \
               --models gpt-oss-20b,gpt-oss-120b --csv "$OUT/moe_gpt_oss.csv" > "$OUT/moe_gpt_oss.log" 2>&1
             echo "bench moe gpt-oss rc $? $(( $(date +%s) - t0 ))s"; grep -v Warn "$OUT/moe_gpt_oss.log" ;;
    overhead) for run in 1 2; do
                timeout 120 python -m torch_fp4 bench overhead --csv "$OUT/overhead_$run.csv" > "$OUT/overhead_$run.log" 2>&1
                echo "bench overhead $run rc $? $(( $(date +%s) - t0 ))s"
                grep -E "F.linear|empty custom op, (4|9)|^mm_fp4 W4A16 |nvfp4_quantize|fused_moe" "$OUT/overhead_$run.log"
              done ;;
    tier) timeout ${TIER_TIMEOUT:-400} python -m pytest -q -m gpu -n 8 -p no:cacheprovider --durations=30 tests \
            > "$OUT/tier.log" 2>&1
          echo "quick tier rc $? $(( $(date +%s) - t0 ))s: $(tail -1 "$OUT/tier.log")"
          grep -E "^(FAILED|ERROR)" "$OUT/tier.log" | head -20 ;;
    sanitize) for fmt in nvfp4 mxfp4; do
                mkdir -p "$OUT/$fmt"
                timeout 290 python scripts/sanitize_kernels.py --sanitize --tools initcheck --timeout 270 \
                  --cases "mm_fp4 row $fmt/triton" --log-dir "$OUT/$fmt" > "$OUT/sanitize_$fmt.log" 2>&1
                echo "initcheck triton $fmt rc $? $(( $(date +%s) - t0 ))s"; tail -2 "$OUT/sanitize_$fmt.log"
              done ;;
    *) echo "unknown part $step (build, mm, moe, gpt-oss, overhead, tier, sanitize)"; exit 2 ;;
  esac
done

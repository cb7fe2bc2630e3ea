#!/usr/bin/env bash
# compute-sanitizer over one shape per quantize-family kernel and backend (run on a GPU machine
# from the checkout). memcheck (out-of-bounds and misaligned accesses), racecheck (shared-memory
# hazards) and initcheck (reads of uninitialised device memory). Driver API calls that fail by
# design (cuda-python probing entry points with cuGetProcAddress) are not reported.
# Prints each tool's summary; exits non-zero if any tool reports an error.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Compile and cache every kernel first, so the sanitized runs check the kernels, not the JIT.
python3 scripts/sanitize_quantize.py > /dev/null || exit 1
rc=0
for tool in memcheck racecheck initcheck; do
  out=$(timeout 240 compute-sanitizer --tool "$tool" --report-api-errors no --target-processes all \
        python3 scripts/sanitize_quantize.py 2>&1)
  echo "$out" | grep -E "^[a-z-]+: (ran|skipped)|SUMMARY" | sed "s/^/[$tool] /"
  summary=$(echo "$out" | grep -E "SUMMARY" | tail -1)
  case "$summary" in
    *"ERROR SUMMARY: 0 errors"*|*"(0 errors, "*) ;;
    *) echo "[$tool] FAILED: ${summary:-no summary}"; rc=1 ;;
  esac
done
exit $rc

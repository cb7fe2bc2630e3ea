#!/usr/bin/env bash
# compute-sanitizer over one shape per quantize-family kernel and backend (run on a GPU machine
# from the checkout). Prints each tool's error summary; exits non-zero if any tool reports one.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Compile and cache every kernel first, so the sanitized runs check the kernels, not the JIT.
python3 scripts/sanitize_quantize.py > /dev/null || exit 1
rc=0
for tool in memcheck racecheck initcheck; do
  out=$(timeout 240 compute-sanitizer --tool "$tool" --target-processes all python3 scripts/sanitize_quantize.py 2>&1)
  echo "$out" | grep -E "^[a-z-]+: (ran|skipped)|ERROR SUMMARY" | sed "s/^/[$tool] /"
  echo "$out" | grep -q "ERROR SUMMARY: 0 errors" || rc=1
done
exit $rc

#!/usr/bin/env bash
# A/B of source variants of one cuda kernel library in one process, on an sm_90 GPU:
#   bash scripts/ab_overlay.sh LIB NAME=DIR [NAME=DIR ...] -- M,N,K [M,N,K ...]
# Builds LIB (e.g. wgmma1_1, the Hopper GEMM at block_m >= 128 on bf16 activations and "sm90" weights) from this
# checkout ("base") and, per NAME=DIR, from a copy of torch_fp4/ with the files of DIR laid over
# torch_fp4/csrc/ (each copy hashes to its own build folder), in parallel; then times auto's tactic
# under every build beside torch bf16 in one process (scripts/ab_libraries.py: rotating operands,
# interleaved rounds, a same-bits check against base). Keep a variant's files, not a branch: the
# overlay is what travels to the GPU machine. Builds' logs: ${AB_LOG:-/tmp/ab_overlay.log}.
set -uo pipefail
lib=$1; shift
declare -a names=() dirs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do names+=("${1%%=*}"); dirs+=("$(cd "${1#*=}" && pwd)"); shift; done
[ "${1:-}" = "--" ] && shift
log=${AB_LOG:-/tmp/ab_overlay.log}
root=$(pwd)
build() {  # prints the library's path; run in the tree to build
  python -c "import torch; from torch_fp4.kernels.cuda import build; print(build.build(torch.cuda.get_device_capability(), ['$lib'])['$lib'])" 2>>"$log" | tail -1
}
base=$(build) || exit 1
for i in "${!names[@]}"; do
  d=/tmp/ab_overlay_${names[$i]}
  (rm -rf "$d" && mkdir -p "$d" && cp -r "$root/torch_fp4" "$d/" && cp "${dirs[$i]}"/* "$d/torch_fp4/csrc/" &&
   cd "$d" && PYTHONPATH="$d" MAX_JOBS=${MAX_JOBS:-4} build > "$d/lib.txt") &
done
wait
args=("base=$base")
for i in "${!names[@]}"; do
  path=$(tail -1 "/tmp/ab_overlay_${names[$i]}/lib.txt" 2>/dev/null)
  [ -f "$path" ] || { echo "ab_overlay: ${names[$i]} did not build (see $log)" >&2; exit 1; }
  args+=("${names[$i]}=$path")
done
python "$root/scripts/ab_libraries.py" "$lib" "${args[@]}" "$@"

# Sourced by the scripts/device_*.sh runners: output folder ($OUT, default /tmp/out), the
# checkout on PYTHONPATH, nvidia-cutlass-dsl from .carry when it travelled, and the GPU and
# versions into $OUT/gpu.txt.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=.
[ -f .carry/device-env.sh ] && source .carry/device-env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

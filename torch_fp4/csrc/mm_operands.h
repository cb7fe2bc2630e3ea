// The operands of an FP4-weight GEMM launch, shared by the cuda backend's GEMMs (mm_small_m.cu,
// mm_wgmma.cu): plain pointers and sizes, no torch or CUDA types (the CPU emulation includes it).
#pragma once

#include <cstdint>

namespace torch_fp4 {

// act: [m, k] bf16/fp16 (act_fp16), w: [n, k/2] packed FP4, w_scale: 128x4 [np, kp] bytes (mx:
// MXFP4, else NVFP4), out: [m, n] of out_dtype (launch.h's DType code), alpha: one fp32 value or
// null; packed: w is in the "sm90" fragment layout (docs/NUMERICS.md 4b; n % 128 == 0,
// k % 64 == 0), else row-major. Each GEMM's argument struct adds its tactic.
struct MmOperands {
  const uint16_t* act;
  const uint8_t* w;
  const uint8_t* w_scale;
  const float* alpha;
  void* out;
  int64_t m, n, k, kp;
  int act_fp16, mx, out_dtype, packed;
};

}  // namespace torch_fp4

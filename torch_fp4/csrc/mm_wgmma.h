// Host interface of the Hopper FP4-weight GEMM (mm_wgmma.cu): plain pointers and sizes.
//
// out[M, N] = RN_out(alpha * sum_k A[m, k] * W[n, k]) with W FP4 [N, K/2] (NVFP4 or MXFP4, 128x4
// block scales) and A 16-bit [M, K] (bf16, or fp16 with NVFP4; W4A4 callers dequantize A first).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace torch_fp4 {

// act: [m, k] bf16/fp16 (act_fp16), rows contiguous, 16-byte aligned, k % 32 == 0;
// w: [n, k/2] packed FP4, 16-byte aligned; w_scale: 128x4 [np, kp] bytes, 16-byte aligned;
// out: [m, n] of out_dtype (launch.h's DType code); alpha: one fp32 value or null.
// Tactic: block_m (activation rows per CTA: 64, 128 or 256; 128 weight rows per CTA), stages
// (3..12), split_k (1..8, a thread-block cluster along K).
struct WgmmaMmArgs {
  const uint16_t* act;
  const uint8_t* w;
  const uint8_t* w_scale;
  const float* alpha;
  void* out;
  int64_t m, n, k, kp;
  int act_fp16, mx, out_dtype;
  int block_m, stages, split_k;
};

// Enqueues the kernel on `stream`; false when the configuration is not compiled for this device
// (not sm_90a, or an unsupported tile) or a tensor map cannot be encoded.
bool launch_wgmma_mm(const WgmmaMmArgs& args, cudaStream_t stream, bool pdl);

// Dynamic shared memory of a launch (mirror of smem_bytes in kernels/cuda/mm_tactics.py).
int wgmma_mm_smem_bytes(int block_m, int stages);

}  // namespace torch_fp4

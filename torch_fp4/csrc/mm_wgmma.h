// Host interface of the Hopper FP4-weight GEMM (mm_wgmma.cu): plain pointers and sizes.
//
// out[M, N] = RN_out(alpha * sum_k A[m, k] * W[n, k]) with W FP4 [N, K/2] (NVFP4 or MXFP4, 128x4
// block scales) and A 16-bit [M, K] (bf16, or fp16 with NVFP4; W4A4 callers dequantize A first).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "mm_operands.h"

namespace torch_fp4 {

// The operands (mm_operands.h; act rows 16-byte aligned with k % 32 == 0, w and w_scale 16-byte
// aligned) and the tactic: block_m (activation rows per CTA: 32, 64, 96, 128, 160, 192, 224 or 256;
// 128 weight rows per CTA), stages (3..12), split_k (1..8, a thread-block cluster along K), persistent (with
// split_k 1: one CTA per SM looping over the output tiles; 16-bit outputs with N % 8 == 0 and a
// 16-byte aligned `out` leave by TMA tensor stores), stream_k (persistent only: every CTA slot
// of the GPU runs, and when the tiles do not fill whole waves the last one to two waves' tiles are
// shared out by K steps, the partial sums meeting through `workspace`).
struct WgmmaMmArgs : MmOperands {
  int block_m, stages, split_k;
  bool persistent;
  int ctas_per_sm;  // 1, or 2 with block_m <= 64 (96 registers per MMA thread)
  bool stream_k;
  int k_groups;     // 1, or 2 ("sm90" weights, ctas_per_sm 1, block_m <= 64, stages >= 6): two MMA
                    // warpgroups per 64 weight rows
  void* workspace;  // wgmma_mm_workspace_bytes(args) bytes of global memory, 16-byte aligned
};

// Enqueues the kernel on `stream`; false when the configuration is not compiled for this device
// (not sm_90a, or an unsupported tile) or a tensor map cannot be encoded.
bool launch_wgmma_mm(const WgmmaMmArgs& args, cudaStream_t stream, bool pdl);

// Global memory a stream-K launch needs for its partial sums and flags (0: none; the launcher
// clears the flags).
int64_t wgmma_mm_workspace_bytes(const WgmmaMmArgs& args);

}  // namespace torch_fp4

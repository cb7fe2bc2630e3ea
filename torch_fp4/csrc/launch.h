// Host interface of the kernels: plain structs of raw pointers and sizes, no torch types. Each
// source's C entry points (capi.h) fill these from their arguments; the kernels never see a tensor.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace torch_fp4 {

// Element types of a source or result tensor.
enum DType : int { kBFloat16 = 0, kFloat16 = 1, kFloat32 = 2, kFloat8E4M3 = 3 };

// Scale-factor layouts; values match the launchers' codes (kernels/cuda/quantize.py).
enum Layout : int { kLayout128x4 = 0, kLayout8x4 = 1, kLayoutLinear = 2 };

// x [batch, rows, k] (batch 1 for 2-D) -> packed data [batch, rows, k/2] and scales
// [batch, rows_padded, kb_padded] in `layout` (rows_padded == rows, kb_padded == k/block for
// linear). gs (NVFP4 only): fp32 element b * gs_stride is batch entry b's global scale.
struct QuantizeArgs {
  const void* x;
  const float* gs;
  int64_t gs_stride;
  uint8_t* data;
  uint8_t* scale;
  int64_t batch;
  int64_t rows;
  int64_t k;
  int64_t rows_padded;
  int64_t kb_padded;
  int layout;
  int in_dtype;
  void* exact;  // launch_*_exact_values: bf16 [batch, rows, k] (data and scale unused)
  const int32_t* src_pairs = nullptr;  // exact values, gathered: x's row of output row m is src_pairs[m] / src_div
  int64_t src_div = 1;
};

// data [batch, rows, k/2] + scales -> out [batch, rows, k]. gs may be null (NVFP4 without a
// global scale, and always for MXFP4).
struct DequantizeArgs {
  const uint8_t* data;
  const uint8_t* scale;
  const float* gs;
  int64_t gs_stride;
  void* out;
  int64_t batch;
  int64_t rows;
  int64_t k;
  int64_t rows_padded;
  int64_t kb_padded;
  int layout;
  int out_dtype;
};

// The largest per-matrix thread index space of a launch (32-bit index arithmetic): quantize has
// one thread per scale entry (rows_padded * kb_padded), dequantize one per packed word
// (rows * k / 8).
constexpr int64_t kMaxThreadsPerMatrix = (int64_t{1} << 31) - 1;

// Each launcher enqueues its kernels on `stream` and returns without synchronizing; the caller
// checks the launch with cudaGetLastError. `pdl` (sm_90+ only): launch with programmatic
// dependent launch (pdl.cuh); every kernel waits for the previous grid before touching memory.
void launch_nvfp4_quantize(const QuantizeArgs& args, cudaStream_t stream, bool pdl);
void launch_mxfp4_quantize(const QuantizeArgs& args, cudaStream_t stream, bool pdl);
void launch_nvfp4_exact_values(const QuantizeArgs& args, cudaStream_t stream, bool pdl);
void launch_mxfp4_exact_values(const QuantizeArgs& args, cudaStream_t stream, bool pdl);
void launch_dequantize(const DequantizeArgs& args, int block_size, cudaStream_t stream, bool pdl);

// out[0] = NVFP4 global scale of the n elements at x. workspace: two uint32 words, zero before
// the call and zero again after it (the last block resets them). num_sms sizes the grid.
void launch_global_scale(const void* x, int64_t n, int in_dtype, float* out, uint32_t* workspace,
                         int num_sms, cudaStream_t stream, bool pdl);

}  // namespace torch_fp4

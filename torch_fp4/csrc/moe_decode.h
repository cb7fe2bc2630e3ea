// The plan of fused_moe's decode path (moe_small_m.cu's torch_fp4_moe_decode): every size and the
// tactic of one problem, fixed per problem. torch_fp4/kernels/cuda/moe.py builds it once per
// problem as a ctypes Structure of the same int64 fields in the same order
// (tests/test_cuda_libraries.py compares them) and passes only the tensors per call.
#pragma once

#include <cstdint>

namespace torch_fp4 {

struct MoeDecodePlan {
  int64_t tokens, hidden, inter, experts, top_k;
  int64_t local_offset;      // topk_ids of local expert e: local_offset + e
  int64_t strict;            // 1: a token with an id outside the local experts gets NaN columns
  int64_t act_fp16;          // FC1's activations (x, or W4A4's exact bf16 values) are fp16
  int64_t out_dtype;         // launch.h's DType of out
  int64_t block_m, warps, tiles_per_warp, block_k, stages, fc1_split, fc2_split;   // the tactic
  int64_t w1_kp, w2_kp;      // bytes per scale row of w1_scale, w2_scale (128x4 layout)
  int64_t w1_s_expert, w2_s_expert;     // bytes between two experts' scales
  int64_t a2_gs_stride;      // W4A4: a2_global_scale [1] (0) or [E] (1); a1_global_scale is one value
  // gpt-oss's features (spec section 6): MXFP4 experts (no global scales; bf16 activations), the
  // dtypes of w1_bias and w2_bias (launch.h's DType: kBFloat16 or kFloat32; the pointers, null
  // for none, come with each call), the activation (0 SwiGLU, 1 the clamped SwiGLU) and its
  // alpha and limit as fp32 bit patterns
  int64_t mx, bias1_dtype, bias2_dtype, activation, swiglu_alpha_bits, swiglu_limit_bits;
  // W4A4 with MXFP4 activations (MXFP4 experts): x arrives as its MXFP4 exact values and FC1's
  // epilogue writes the intermediate's (no global scales)
  int64_t act_mx;
  // Every expert of w1 and w2 in the "sm90" layout (docs/NUMERICS.md 4b; block_m <= 16), else
  // row-major
  int64_t packed;
};

// The workspace of one call, carved from one buffer: the grouping (sorted_pairs [rows],
// block_expert [blocks], expert_end [experts], int32), FC1's output h [rows, inter] and FC2's
// y [tokens * top_k, hidden] (bf16); offsets in bytes, each 256-byte aligned.
struct MoeDecodeWorkspace {
  int64_t blocks, rows;
  int64_t sorted_pairs, block_expert, expert_end, h, y, bytes;
};

inline int64_t moe_decode_align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Blocks of block_m rows that any routing of the plan's pairs can use: each expert with pairs adds
// at most block_m - 1 padding rows (kernels/triton/moe_align.py max_blocks).
inline MoeDecodeWorkspace moe_decode_workspace(const MoeDecodePlan& p) {
  MoeDecodeWorkspace w{};
  const int64_t pairs = p.tokens * p.top_k;
  const int64_t routed = pairs < p.experts ? pairs : p.experts;
  w.blocks = (pairs + (p.block_m - 1) * routed + p.block_m - 1) / p.block_m;
  w.rows = w.blocks * p.block_m;
  w.sorted_pairs = 0;
  w.block_expert = w.sorted_pairs + moe_decode_align256(4 * w.rows);
  w.expert_end = w.block_expert + moe_decode_align256(4 * w.blocks);
  w.h = w.expert_end + moe_decode_align256(4 * p.experts);
  w.y = w.h + moe_decode_align256(2 * w.rows * p.inter);
  w.bytes = w.y + moe_decode_align256(2 * pairs * p.hidden);
  return w;
}

}  // namespace torch_fp4

// Small-M FP4 GEMM (M <= 64) of the cuda backend: device context, kernel and launcher. The kernel
// body, its shared-memory layout and the decode are in mm_small_m.cuh (see the design notes there).
#include <algorithm>
#include <cstdint>

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "capi.h"
#include "launch.h"
#include "mm_small_m.cuh"
#include "pdl.cuh"

namespace torch_fp4 {
namespace small_m {

static_assert(kOutBf16 == kBFloat16 && kOutF16 == kFloat16 && kOutF32 == kFloat32,
              "output dtype codes must match launch.h");

namespace cg = cooperative_groups;

constexpr int kMaxDevices = 64;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The GPU side of the kernel body's context: indices, barriers, cp.async, warp MMA, cluster.
struct DeviceCtx {
  char* base;

  __device__ __forceinline__ char* smem() const { return base; }
  __device__ __forceinline__ int tid() const { return static_cast<int>(threadIdx.x); }
  __device__ __forceinline__ int tile() const { return static_cast<int>(blockIdx.x); }
  // The K split is blockIdx.y; the launch makes the splits of one tile a cluster (1, split, 1),
  // so it is also the CTA's rank in its cluster.
  __device__ __forceinline__ int rank() const { return static_cast<int>(blockIdx.y); }
  __device__ __forceinline__ int splits() const { return static_cast<int>(gridDim.y); }

  __device__ __forceinline__ void sync() const { __syncthreads(); }
  template <class T>
  __device__ __forceinline__ T lds(const T* p) const { return *p; }
  __device__ __forceinline__ void pdl_wait() const { torch_fp4::pdl_wait(); }
  __device__ __forceinline__ void pdl_launch_dependents() const { torch_fp4::pdl_launch_dependents(); }

  // Weights: streamed once, L2 only.
  __device__ __forceinline__ void cp_async16_stream(void* dst, const void* src, int bytes) const {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
  }
  // Activations and scales: read by every CTA of the same K range, L1 allocating.
  __device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) const {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
  }
  __device__ __forceinline__ void cp_async8(void* dst, const void* src, int bytes) const {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
  }
  __device__ __forceinline__ void cp_async4(void* dst, const void* src, int bytes) const {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
  }
  __device__ __forceinline__ void cp_commit() const { asm volatile("cp.async.commit_group;" ::: "memory"); }
  // At most n (a launch constant, 0..4) of this thread's newest groups still pending.
  __device__ __forceinline__ void cp_wait(int n) const {
    switch (n) {
      case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
      case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
      case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
      case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
      default: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    }
  }
  __device__ __forceinline__ void cp_wait_all() const { asm volatile("cp.async.wait_all;" ::: "memory"); }

  // Four 8x8 b16 matrices: lane l gives the 16-byte row l % 8 of matrix l / 8 and receives word
  // l % 4 of row l / 4 of each matrix.
  __device__ __forceinline__ U128 ldmatrix_x4(const void* row) const {
    U128 r;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "r"(smem_addr(row)));
    return r;
  }

  // d += A * B for one m16n8k16 tile: A rows (a0: row g, k 2t..2t+1; a1: row g+8; a2, a3: k + 8),
  // B columns (b0: k 2t..2t+1 of column g; b1: k + 8), fp32 accumulators.
  template <bool kFp16>
  __device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                      uint32_t b0, uint32_t b1) const {
    if constexpr (kFp16) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }

  __device__ __forceinline__ void cluster_sync() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#endif
  }
  // The same shared-memory location in the CTA of cluster rank r (distributed shared memory).
  __device__ __forceinline__ const float* remote(const float* p, int r) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cg::this_cluster().map_shared_rank(const_cast<float*>(p), static_cast<unsigned>(r));
#else
    return p;
#endif
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) small_m_mm_kernel(const Params p, int stages) {
  extern __shared__ __align__(16) char smem[];
  DeviceCtx ctx{smem};
  small_m_mm<Cfg>(p, ctx, stages);
}

template <class Cfg>
void launch_cfg(const SmallMMmArgs& a, cudaStream_t stream, bool pdl) {
  const int steps = static_cast<int>((a.k + Cfg::kBK - 1) / Cfg::kBK);
  const int split = std::max(1, std::min(a.split_k, std::max(steps, 1)));
  Params p = operand_params(a, (steps + split - 1) / split);
  p.w_aligned16 = (a.k % 32 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0) ? 1 : 0;  // always, "sm90"

  const int smem = smem_bytes<Cfg>(a.stages);
  auto kernel = small_m_mm_kernel<Cfg>;
  static int configured[kMaxDevices] = {};
  reserve_smem(kernel, smem, configured);
  const dim3 grid(static_cast<unsigned>((a.n + Cfg::kBN - 1) / Cfg::kBN), static_cast<unsigned>(split), 1);
  // The splits of one weight tile form a cluster along y (reduced through distributed smem).
  launch_cluster(kernel, grid, dim3(static_cast<unsigned>(Cfg::kThreads), 1, 1), smem,
                 dim3(1, static_cast<unsigned>(split), 1), stream, pdl, p, a.stages);
}

// The compiled tile shapes (warps, MMA tiles per warp, block_k): tile_compiled() in
// mm_small_m.cuh; the tactic space (torch_fp4/kernels/cuda/mm_tactics.py) offers exactly these.
template <int kNB, bool kFp16, bool kMx, bool kPacked>
bool launch_nb(const SmallMMmArgs& a, cudaStream_t stream, bool pdl) {
#define TORCH_FP4_SMALL_M_TILE(W, WR, BK)                                        \
  if constexpr (tile_compiled(kNB, W, WR, BK)) {                                 \
    if (a.warps == W && a.tiles_per_warp == WR && a.block_k == BK) {             \
      launch_cfg<Config<kNB, W, WR, BK, kFp16, kMx, kPacked>>(a, stream, pdl);   \
      return true;                                                               \
    }                                                                            \
  }
  TORCH_FP4_SMALL_M_TILE(8, 1, 256)
  TORCH_FP4_SMALL_M_TILE(4, 1, 256)
  TORCH_FP4_SMALL_M_TILE(4, 2, 256)
  TORCH_FP4_SMALL_M_TILE(8, 1, 128)
  TORCH_FP4_SMALL_M_TILE(4, 1, 128)
  TORCH_FP4_SMALL_M_TILE(4, 2, 128)
#undef TORCH_FP4_SMALL_M_TILE
  return false;
}

template <bool kFp16, bool kMx, bool kPacked>
bool launch_format(const SmallMMmArgs& a, cudaStream_t stream, bool pdl) {
  const int64_t nb = (a.m + 7) / 8;
  if constexpr (kPacked) {  // "sm90" weights: whole 128 x 64 tiles, compiled for packed_compiled(nb)
    if (a.n % 128 != 0 || a.k % 64 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return false;
    static_assert(packed_compiled(2) && !packed_compiled(3), "the dispatch below");
    if (nb <= 1) return launch_nb<1, kFp16, kMx, true>(a, stream, pdl);
    if (nb <= 2) return launch_nb<2, kFp16, kMx, true>(a, stream, pdl);
    return false;
  } else {
    if (nb <= 1) return launch_nb<1, kFp16, kMx, false>(a, stream, pdl);
    if (nb <= 2) return launch_nb<2, kFp16, kMx, false>(a, stream, pdl);
    if (nb <= 4) return launch_nb<4, kFp16, kMx, false>(a, stream, pdl);
    if (nb <= 8) return launch_nb<8, kFp16, kMx, false>(a, stream, pdl);
    return false;
  }
}

// Variant kV's kernels (mm_operands.h), where this unit holds them.
template <int kV>
bool launch_variant(const SmallMMmArgs& a, cudaStream_t stream, bool pdl) {
  if constexpr (mm_variant_compiled<kV>()) {
    constexpr MmVariant v = kMmVariants[kV];
    return launch_format<v.fp16, v.mx, v.packed>(a, stream, pdl);
  } else {
    return false;
  }
}

}  // namespace small_m

bool launch_small_m_mm(const SmallMMmArgs& args, cudaStream_t stream, bool pdl) {
  if (args.stages < 2 || args.stages > 6 || args.split_k < 1 || args.split_k > small_m::kMaxSplit) return false;
  if (args.m <= 0 || args.n <= 0) return true;
  return with_mm_variant(mm_variant(args), [&](auto v) {
    return small_m::launch_variant<decltype(v)::value>(args, stream, pdl);
  });
}

}  // namespace torch_fp4

// C entry point (capi.h): the small-M GEMM on MmOperands (make_mm_operands) with the tactic warps,
// tiles_per_warp, block_k, stages, split_k.
TORCH_FP4_CAPI int torch_fp4_mm_small_m(int device, void* stream, int pdl, const void* act, const void* w,
                                        const void* w_scale, const float* alpha, void* out, int64_t m, int64_t n,
                                        int64_t k, int64_t kp, int act_fp16, int mx, int out_dtype, int packed,
                                        int warps, int tiles_per_warp, int block_k, int stages, int split_k) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  torch_fp4::SmallMMmArgs a{};
  static_cast<torch_fp4::MmOperands&>(a) =
      torch_fp4::make_mm_operands(act, w, w_scale, alpha, out, m, n, k, kp, act_fp16, mx, out_dtype, packed);
  a.warps = warps;
  a.tiles_per_warp = tiles_per_warp;
  a.block_k = block_k;
  a.stages = stages;
  a.split_k = split_k;
  return torch_fp4::capi_end(torch_fp4::launch_small_m_mm(a, static_cast<cudaStream_t>(stream), pdl != 0));
}

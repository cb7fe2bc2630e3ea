// Hopper (sm_90a) PTX wrappers of the wgmma GEMM (mm_wgmma.cu): shared-memory addresses and loads,
// mbarriers, TMA and bulk copies, wgmma fences and waits, cluster barriers, the 128-byte-swizzle
// descriptor.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "small_m_ops.cuh"

namespace torch_fp4 {
namespace wgmma_mm {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Barrier helpers on shared-memory addresses (computed once: a generic-to-shared conversion in the
// main loop costs uniform-datapath instructions every stage).
// The wait passes try_wait a suspend-time hint (kWaitHintNs; ptxas emits NANOSLEEP.SYNCS and a
// phase check after a failed TRYWAIT): a waiting thread sleeps until the phase completes or the
// hint runs out instead of polling. Same results; measured faster under the power limit
// (BENCHMARKS.md, "barrier waits that sleep").
constexpr uint32_t kWaitHintNs = 10000000u;
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity), "r"(kWaitHintNs)
      : "memory");
}

// The copies and the arrival of a producer, on shared-memory addresses (destination, mbarrier).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          dst),
      "l"(map), "r"(bar), "r"(x), "r"(y)
      : "memory");
}

// A consumer warp's release of a stage: one arrival on its empty mbarrier when `lead`. Predicated,
// not branched: a branch between wgmmas makes ptxas serialize them.
__device__ __forceinline__ void release_stage(uint32_t bar, bool lead) {
  asm volatile(
      "{\n.reg .pred lead;\nsetp.ne.u32 lead, %1, 0;\n@lead mbarrier.arrive.shared::cta.b64 _, [%0];\n}" ::"r"(bar),
      "r"(static_cast<uint32_t>(lead))
      : "memory");
}

// One arrival on an mbarrier (release: this thread's shared-memory writes before it are visible
// to whoever then waits on the phase).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void sts64(uint32_t addr, uint32_t x, uint32_t y) {
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(x), "r"(y) : "memory");
}

__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Shared-memory loads at shared-memory addresses: 16, 8 and 4 bytes.
__device__ __forceinline__ small_m::U128 lds128(uint32_t addr) {
  small_m::U128 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void lds64(uint32_t addr, uint32_t& x, uint32_t& y) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(x), "=r"(y) : "r"(addr));
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
// Four fp32 words at shared address `addr` of this CTA, or at the same offset in cluster rank
// `rank`'s shared memory (distributed shared memory), into fp32 registers (lds128's u32 registers
// would move ptxas's allocation in the kernels' main loops). Volatile, as the loads above: they
// stay after the cluster barrier that publishes the words.
__device__ __forceinline__ small_m::F4 lds128f(uint32_t addr) {
  small_m::F4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ small_m::F4 ld_cluster128f(uint32_t addr, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  small_m::F4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote));
  return v;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

template <int kN>
__device__ __forceinline__ void fence_regs(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The MMA threads that store a tile (K group 0's; all of them with one K group).
template <class Cfg>
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(Cfg::kEpi) : "memory"); }

// wgmma shared-memory descriptor of a K-major tile with 128-byte rows in the 128-byte swizzle
// (8-row groups 1024 bytes apart), starting at `addr`; the tile 32 j bytes further (K 16 j..) has
// the descriptor + 2 j (the address field is addr / 16 in the low 14 bits, shared memory < 256 KiB).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{64} << 32) |
         (uint64_t{1} << 62);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace wgmma_mm
}  // namespace torch_fp4

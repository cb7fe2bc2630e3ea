// Programmatic dependent launch (PDL, sm_90+). With `pdl` true a kernel is launched with
// cudaLaunchKernelEx and cudaLaunchAttributeProgrammaticStreamSerialization on the same stream,
// so it may start while the previous kernel on the stream is still running; with `pdl` false it
// is an ordinary <<<>>> launch. Every kernel calls pdl_wait() before its first global-memory read
// or write: griddepcontrol.wait returns once the previous grid has completed and its memory is
// visible (at once when the kernel was launched without PDL, and compiled out before sm_90).
// pdl_launch_dependents() lets the next PDL-launched kernel start early; it never affects
// correctness, since that kernel waits in turn before touching memory.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "launch_record.cuh"

namespace torch_fp4 {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, 0, stream>>>(args...), with the PDL attribute when `pdl`. Errors are left
// for the caller's cudaGetLastError (C10_CUDA_KERNEL_LAUNCH_CHECK), as with <<<>>>. While this
// thread records launches (launch_record.cuh), the launch is recorded instead.
template <typename... Params, typename... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                          bool pdl, Args&&... args) {
  if (LaunchRecord* record = t_launch_record) {
    record->add(kernel, grid, block, 0, std::forward<Args>(args)...);
    return;
  }
  if (!pdl) {
    kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// kernel<<<grid, block, smem, stream>>>(args...) launched as thread-block clusters of `cluster`
// CTAs (dim3(1, 1, 1): no cluster), with the PDL attribute when `pdl`. Errors are left for the
// caller's cudaGetLastError. While this thread records launches, the launch is recorded instead
// (the cluster shape and PDL are the graph node's, fixed when it was captured).
template <typename... Params, typename... Args>
inline void launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, dim3 cluster,
                           cudaStream_t stream, bool pdl, Args&&... args) {
  if (LaunchRecord* record = t_launch_record) {
    record->add(kernel, grid, block, smem, std::forward<Args>(args)...);
    return;
  }
  cudaLaunchAttribute attrs[2];
  unsigned n_attrs = 0;
  if (pdl) {
    attrs[n_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n_attrs].val.programmaticStreamSerializationAllowed = 1;
    ++n_attrs;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs[n_attrs].id = cudaLaunchAttributeClusterDimension;
    attrs[n_attrs].val.clusterDim.x = cluster.x;
    attrs[n_attrs].val.clusterDim.y = cluster.y;
    attrs[n_attrs].val.clusterDim.z = cluster.z;
    ++n_attrs;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n_attrs;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Lets `kernel` take `smem` bytes of dynamic shared memory (needed above 48 KiB), once per device
// and size: `configured` is the caller's per-kernel record, so that launches inside a CUDA-graph
// capture (after a warm-up call) make no attribute calls.
template <typename Kernel, int kDevices>
inline void reserve_smem(Kernel kernel, int smem, int (&configured)[kDevices]) {
  int device = 0;
  (void)cudaGetDevice(&device);
  if (smem > 48 * 1024 && (device >= kDevices || configured[device] < smem)) {
    (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (device < kDevices) configured[device] = smem;
  }
}

}  // namespace torch_fp4

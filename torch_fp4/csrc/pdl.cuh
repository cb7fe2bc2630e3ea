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
// for the caller's cudaGetLastError (C10_CUDA_KERNEL_LAUNCH_CHECK), as with <<<>>>.
template <typename... Params, typename... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                          bool pdl, Args&&... args) {
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

}  // namespace torch_fp4

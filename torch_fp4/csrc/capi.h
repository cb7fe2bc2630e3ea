// The C entry points of the cuda backend's kernel libraries. Each library (one kernel source, or
// one kernel variant of a GEMM source: torch_fp4/kernels/cuda/build.py) is a shared object built
// by nvcc alone, without torch headers, and called from Python through ctypes
// (torch_fp4/kernels/cuda/native.py) with raw pointers, sizes and the raw CUDA stream.
//
// Conventions of every entry point: the first three arguments are the CUDA device index, the
// stream (a cudaStream_t, 0 for the legacy default stream) and pdl (programmatic dependent
// launch, pdl.cuh); the result is 0 when the kernels were enqueued, kNotCompiled when this
// library holds no kernel for the arguments (an unsupported tactic or variant), or the CUDA error
// of the launch (a cudaError_t value; torch_fp4_error_string names it). A library links its own
// static CUDA runtime, whose current device is its own: each call makes `device` current there.
#pragma once

#include <cuda_runtime_api.h>

#define TORCH_FP4_CAPI extern "C" __attribute__((visibility("default")))

namespace torch_fp4 {

constexpr int kNotCompiled = -1;

// Makes `device` current for this library's runtime; a CUDA error code, or 0.
inline int capi_begin(int device) { return static_cast<int>(cudaSetDevice(device)); }

// The status of an entry point whose launcher returned `launched`.
inline int capi_end(bool launched) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return static_cast<int>(e);
  return launched ? 0 : kNotCompiled;
}

}  // namespace torch_fp4

// The name and description of a status code (weak: every unit of a library may define it).
TORCH_FP4_CAPI __attribute__((weak)) const char* torch_fp4_error_string(int code) {
  if (code == torch_fp4::kNotCompiled) return "no kernel of this library matches the arguments";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

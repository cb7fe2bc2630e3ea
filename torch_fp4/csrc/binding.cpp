// Torch binding of the cuda backend: reads sizes and pointers off tensors that the Python
// launchers (torch_fp4/kernels/cuda/quantize.py, mm.py) allocated and validated, and enqueues the
// kernels on the current CUDA stream of the tensors' device. `pdl` (from use_pdl(), true only on
// sm_90+): launch with programmatic dependent launch (pdl.cuh).
#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>  // the Tensor caster of pybind11, without torch/extension.h's whole API

#include "launch.h"
#include "mm_small_m.cuh"
#include "mm_wgmma.h"

namespace {

using namespace torch_fp4;

int dtype_code(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return kBFloat16;
    case at::kHalf: return kFloat16;
    case at::kFloat: return kFloat32;
    case at::kFloat8_e4m3fn: return kFloat8E4M3;
    default: TORCH_CHECK(false, "torch_fp4 cuda backend: unsupported dtype of ", what, ": ", t.scalar_type());
  }
  return -1;
}

void check_cuda(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_cuda(), "torch_fp4 cuda backend: ", what, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), "torch_fp4 cuda backend: ", what, " must be contiguous");
}

// Global-scale pointer and the element stride between batch entries (0 for a single scale).
std::pair<const float*, int64_t> global_scale_ptr(const at::Tensor& gs) {
  TORCH_CHECK(gs.is_cuda() && gs.scalar_type() == at::kFloat,
              "torch_fp4 cuda backend: global_scale must be a CUDA float32 tensor");
  const int64_t stride = gs.numel() == 1 ? 0 : gs.stride(0);
  return {gs.data_ptr<float>(), stride};
}

QuantizeArgs quantize_args(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale, int64_t layout) {
  check_cuda(x, "x");
  check_cuda(data, "data");
  check_cuda(scale, "scale");
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "torch_fp4 cuda backend: x must be 2-D or 3-D");
  QuantizeArgs a{};
  a.x = x.data_ptr();
  a.data = static_cast<uint8_t*>(data.data_ptr());
  a.scale = static_cast<uint8_t*>(scale.data_ptr());
  a.batch = x.dim() == 3 ? x.size(0) : 1;
  a.rows = x.size(-2);
  a.k = x.size(-1);
  a.rows_padded = scale.size(-2);
  a.kb_padded = scale.size(-1);
  a.layout = static_cast<int>(layout);
  a.in_dtype = dtype_code(x, "x");
  TORCH_CHECK(a.rows_padded * a.kb_padded <= kMaxThreadsPerMatrix,
              "torch_fp4 cuda backend: scale matrix too large for 32-bit indexing");
  return a;
}

void nvfp4_quantize(const at::Tensor& x, const at::Tensor& global_scale, const at::Tensor& data,
                    const at::Tensor& scale, int64_t layout, bool pdl) {
  const c10::cuda::CUDAGuard guard(x.device());
  QuantizeArgs a = quantize_args(x, data, scale, layout);
  const auto gs = global_scale_ptr(global_scale);
  a.gs = gs.first;
  a.gs_stride = gs.second;
  launch_nvfp4_quantize(a, c10::cuda::getCurrentCUDAStream(), pdl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void mxfp4_quantize(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale, int64_t layout,
                    bool pdl) {
  const c10::cuda::CUDAGuard guard(x.device());
  const QuantizeArgs a = quantize_args(x, data, scale, layout);
  launch_mxfp4_quantize(a, c10::cuda::getCurrentCUDAStream(), pdl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void dequantize(const at::Tensor& data, const at::Tensor& scale,
                const std::optional<at::Tensor>& global_scale, const at::Tensor& out, int64_t block_size,
                int64_t layout, bool pdl) {
  const c10::cuda::CUDAGuard guard(data.device());
  check_cuda(data, "data");
  check_cuda(scale, "scale");
  check_cuda(out, "out");
  TORCH_CHECK(data.dim() == 2 || data.dim() == 3, "torch_fp4 cuda backend: data must be 2-D or 3-D");
  TORCH_CHECK(block_size == 16 || block_size == 32, "torch_fp4 cuda backend: block_size must be 16 or 32");
  DequantizeArgs a{};
  a.data = static_cast<const uint8_t*>(data.data_ptr());
  a.scale = static_cast<const uint8_t*>(scale.data_ptr());
  if (global_scale.has_value()) {
    const auto gs = global_scale_ptr(*global_scale);
    a.gs = gs.first;
    a.gs_stride = gs.second;
  }
  a.out = out.data_ptr();
  a.batch = data.dim() == 3 ? data.size(0) : 1;
  a.rows = data.size(-2);
  a.k = data.size(-1) * 2;
  a.rows_padded = scale.size(-2);
  a.kb_padded = scale.size(-1);
  a.layout = static_cast<int>(layout);
  a.out_dtype = dtype_code(out, "out");
  TORCH_CHECK(a.out_dtype != kFloat8E4M3, "torch_fp4 cuda backend: out must be bf16, fp16 or fp32");
  TORCH_CHECK(a.rows * (a.k / 8) <= kMaxThreadsPerMatrix && a.rows_padded * a.kb_padded <= kMaxThreadsPerMatrix,
              "torch_fp4 cuda backend: matrix too large for 32-bit indexing");
  launch_dequantize(a, static_cast<int>(block_size), c10::cuda::getCurrentCUDAStream(), pdl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void global_scale(const at::Tensor& x, const at::Tensor& out, const at::Tensor& workspace, bool pdl) {
  const c10::cuda::CUDAGuard guard(x.device());
  check_cuda(x, "x");
  check_cuda(out, "out");
  check_cuda(workspace, "workspace");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.numel() == 1,
              "torch_fp4 cuda backend: out must be one float32 element");
  TORCH_CHECK(workspace.scalar_type() == at::kInt && workspace.numel() >= 2,
              "torch_fp4 cuda backend: workspace must hold two int32 words");
  int num_sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, x.device().index()));
  launch_global_scale(x.data_ptr(), x.numel(), dtype_code(x, "x"), out.data_ptr<float>(),
                      reinterpret_cast<uint32_t*>(workspace.data_ptr<int32_t>()), num_sms,
                      c10::cuda::getCurrentCUDAStream(), pdl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Checks the operands of out [m, n] = alpha * act [m, k] @ w [n, k/2]^T and fills the fields that
// the GEMM launch structs share (MmOperands). The weight and its 128x4 scales [np, kp] arrive as
// mm_fp4 takes them, transposed (w_t = w.T, w_scale_t = w_scale.T, any 1-byte dtype), so the
// launcher makes no views; alpha: one fp32 element or None.
void fill_mm_operands(MmOperands& a, const at::Tensor& act, const at::Tensor& w_t, const at::Tensor& w_scale_t,
                      const std::optional<at::Tensor>& alpha, const at::Tensor& out, int64_t block_size,
                      bool packed) {
  TORCH_CHECK(w_t.dim() == 2 && w_scale_t.dim() == 2, "torch_fp4 cuda backend: w_t and w_scale_t must be 2-D");
  const at::Tensor w = w_t.t(), w_scale = w_scale_t.t();
  check_cuda(act, "act");
  check_cuda(w, "w");
  check_cuda(w_scale, "w_scale");
  check_cuda(out, "out");
  TORCH_CHECK(act.dim() == 2 && act.is_contiguous() &&
                  (act.scalar_type() == at::kBFloat16 || act.scalar_type() == at::kHalf),
              "torch_fp4 cuda backend: act must be a contiguous 2-D bf16 or fp16 tensor, got ", act.sizes(), " ",
              act.scalar_type());
  TORCH_CHECK(w.element_size() == 1 && w.size(1) * 2 == act.size(1) && w.is_contiguous(),
              "torch_fp4 cuda backend: w must be contiguous [N, K/2] of 1-byte elements with K = act.size(1) = ", act.size(1),
              ", got ", w.sizes(), " ", w.scalar_type());
  TORCH_CHECK(block_size == 16 || block_size == 32, "torch_fp4 cuda backend: block_size must be 16 or 32, got ",
              block_size);
  const int64_t m = act.size(0), n = w.size(0), k = act.size(1);
  const int64_t kp = (k / block_size + 3) / 4 * 4, np = (n + 127) / 128 * 128;
  TORCH_CHECK(w_scale.element_size() == 1 && w_scale.size(0) == np && w_scale.size(1) == kp && w_scale.is_contiguous(),
              "torch_fp4 cuda backend: w_scale must be contiguous [", np, ", ", kp, "] bytes (128x4 layout), got ",
              w_scale.sizes(), " ", w_scale.scalar_type());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == m && out.size(1) == n && out.is_contiguous(),
              "torch_fp4 cuda backend: out must be contiguous [", m, ", ", n, "], got ", out.sizes());
  a.act = reinterpret_cast<const uint16_t*>(act.data_ptr());
  a.w = static_cast<const uint8_t*>(w.data_ptr());
  a.w_scale = static_cast<const uint8_t*>(w_scale.data_ptr());
  if (alpha.has_value()) {
    TORCH_CHECK(alpha->is_cuda() && alpha->scalar_type() == at::kFloat && alpha->numel() == 1,
                "torch_fp4 cuda backend: alpha must be one CUDA float32 element, got ", alpha->sizes(), " ",
                alpha->scalar_type());
    a.alpha = alpha->data_ptr<float>();
  }
  a.out = out.data_ptr();
  a.m = m;
  a.n = n;
  a.k = k;
  a.kp = kp;
  a.act_fp16 = act.scalar_type() == at::kHalf ? 1 : 0;
  a.mx = block_size == 32 ? 1 : 0;
  a.packed = packed ? 1 : 0;
  a.out_dtype = dtype_code(out, "out");
  TORCH_CHECK(a.out_dtype != kFloat8E4M3, "torch_fp4 cuda backend: out must be bf16, fp16 or fp32");
}

// The small-M FP4 GEMM (mm_small_m.cu); tactic: warps, MMA tiles per warp, block_k, stages, split_k;
// packed: w in the "sm90" layout.
void mm_fp4_small_m(const at::Tensor& act, const at::Tensor& w_t, const at::Tensor& w_scale_t,
                    const std::optional<at::Tensor>& alpha, const at::Tensor& out, int64_t block_size,
                    int64_t warps, int64_t tiles_per_warp, int64_t block_k, int64_t stages, int64_t split_k,
                    bool packed, bool pdl) {
  const c10::cuda::CUDAGuard guard(act.device());
  SmallMMmArgs a{};
  fill_mm_operands(a, act, w_t, w_scale_t, alpha, out, block_size, packed);
  a.warps = static_cast<int>(warps);
  a.tiles_per_warp = static_cast<int>(tiles_per_warp);
  a.block_k = static_cast<int>(block_k);
  a.stages = static_cast<int>(stages);
  a.split_k = static_cast<int>(split_k);
  const bool ok = launch_small_m_mm(a, c10::cuda::getCurrentCUDAStream(), pdl);
  TORCH_CHECK(ok, "torch_fp4 cuda backend: no compiled small-M GEMM for M=", a.m, " warps=", warps,
              " tiles_per_warp=", tiles_per_warp, " block_k=", block_k, " stages=", stages,
              (a.act_fp16 && a.mx) ? " (fp16 activations with MXFP4 weights are not supported)" : "",
              packed ? " (sm90 weight layout: M <= 16, N % 128 == 0, K % 64 == 0, w 16-byte aligned)" : "");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The Hopper wgmma GEMM (mm_wgmma.cu); tactic: block_m (32/64/128/256), stages, split_k, persistent, ctas_per_sm,
// stream_k (its workspace comes from the caching allocator, freed to the stream after the launch).
void mm_fp4_wgmma(const at::Tensor& act, const at::Tensor& w_t, const at::Tensor& w_scale_t,
                  const std::optional<at::Tensor>& alpha, const at::Tensor& out, int64_t block_size,
                  int64_t block_m, int64_t stages, int64_t split_k, bool persistent, int64_t ctas_per_sm,
                  bool stream_k, bool packed, bool pdl) {
  const c10::cuda::CUDAGuard guard(act.device());
  WgmmaMmArgs a{};
  fill_mm_operands(a, act, w_t, w_scale_t, alpha, out, block_size, packed);
  a.block_m = static_cast<int>(block_m);
  a.stages = static_cast<int>(stages);
  a.split_k = static_cast<int>(split_k);
  a.persistent = persistent;
  a.ctas_per_sm = static_cast<int>(ctas_per_sm);
  a.stream_k = stream_k;
  at::Tensor workspace;
  if (const int64_t bytes = wgmma_mm_workspace_bytes(a); bytes > 0) {
    workspace = at::empty({bytes}, act.options().dtype(at::kByte));
    a.workspace = workspace.data_ptr();
  }
  const bool ok = launch_wgmma_mm(a, c10::cuda::getCurrentCUDAStream(), pdl);
  TORCH_CHECK(ok, "torch_fp4 cuda backend: the Hopper GEMM cannot run block_m=", block_m,
              " stages=", stages, " split_k=", split_k, " persistent=", persistent, " ctas_per_sm=", ctas_per_sm,
              " stream_k=", stream_k, " K=", a.k, packed ? " (sm90 weight layout)" : "",
              " here (it needs compute capability 9.0, K % 32 == 0 (sm90 layout: K % 64 == 0, N % 128 == 0), "
              "16-byte aligned operands and a tensor map)");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("nvfp4_quantize", &nvfp4_quantize, "NVFP4 quantize into preallocated data and scale");
  m.def("mxfp4_quantize", &mxfp4_quantize, "MXFP4 quantize into preallocated data and scale");
  m.def("dequantize", &dequantize, "FP4 dequantize into a preallocated output");
  m.def("global_scale", &global_scale, "NVFP4 global scale of a whole tensor (one launch)");
  m.def("mm_fp4_small_m", &mm_fp4_small_m, "FP4 GEMM for M <= 64 into a preallocated output");
  m.def("mm_fp4_wgmma", &mm_fp4_wgmma, "Hopper (sm_90a) FP4-weight wgmma GEMM into a preallocated output");
}

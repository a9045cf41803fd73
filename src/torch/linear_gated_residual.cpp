// linear_gated_residual: residual + gate * (x @ weight^T + bias) in fp32, rounded once to the
// dtype of every argument (include/ltx_kernels/linear_gated_residual.h): x [B, S, K], weight
// [N, K], bias [N] or none, residual [B, S, N], gate [B, 1, N], [N] or none (ones).
//
// CUDA: our CUTLASS kernel on Hopper for 16-bit arguments it takes (k and n multiples of 8,
// 16-byte aligned rows: a misaligned operand is copied once); otherwise cuBLAS's GEMM with an
// fp32 output, then the residual in fp32 torch ops, rounded once as the kernel does. CPU: the
// GEMM on fp32 upcasts (BLAS, as fast as a CPU linear gets), then the same. The naive C++
// reference (src/reference) is the CUDA kernel's oracle in the GoogleTests.
#include <ATen/ATen.h>

#include "ltx_kernels/linear_gated_residual.h"
#include "torch/common.h"
#include "torch/op_checks.h"
#include "torch/registration.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace ltx_kernels::torch_ext {

void check_linear_gated_residual(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                                 const at::Tensor& residual, const OptTensor& maybe_gate) {
  const at::ScalarType dtype = x.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
                   "x must be float32, float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 3, "x must be [B, S, K], got ", dims_str(x.sym_sizes()));
  const at::Device device = x.device();
  const auto check_tensor = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must have x's dtype ", x.scalar_type(), ", got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.device() == device, name, " must be on x's device ", device_str(device), ", got ",
                      device_str(t.device()));
  };
  check_tensor(weight, "weight");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.sym_size(1) == x.sym_size(2),
                    "weight must be [N, K] with K = x's last dim (x ", dims_str(x.sym_sizes()), "), got ",
                    dims_str(weight.sym_sizes()));
  const c10::SymInt& n = weight.sym_size(0);
  if (bias) {
    check_tensor(*bias, "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->sym_size(0) == n, "bias must be [N] with N = weight.size(0) (weight ",
                      dims_str(weight.sym_sizes()), "), got ", dims_str(bias->sym_sizes()));
  }
  check_tensor(residual, "residual");
  const std::vector<c10::SymInt> out_shape = {x.sym_size(0), x.sym_size(1), n};
  TORCH_CHECK_VALUE(residual.sym_sizes() == c10::SymIntArrayRef(out_shape), "residual must be [B, S, N] = ",
                    dims_str(out_shape), " (x's rows, weight's N), got ", dims_str(residual.sym_sizes()));
  if (!maybe_gate) return;
  const at::Tensor& gate = *maybe_gate;
  check_tensor(gate, "gate");
  const bool per_batch = gate.dim() == 3 && gate.sym_size(0) == x.sym_size(0) && gate.sym_size(1) == 1 &&
                         gate.sym_size(2) == n;
  const std::vector<c10::SymInt> per_batch_shape = {x.sym_size(0), 1, n};
  TORCH_CHECK_VALUE(per_batch || (gate.dim() == 1 && gate.sym_size(0) == n),
                    "gate must be [B, 1, N] or [N] with B = x.size(0), N = weight.size(0) (one gate row per batch; "
                    "for a per-token gate use a linear, then gated_residual): expected ",
                    dims_str(per_batch_shape), " or ", dims_str({n}), ", got ", dims_str(gate.sym_sizes()));
}

namespace {

at::Tensor linear_gated_residual_meta(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                                      const at::Tensor& residual, const OptTensor& gate) {
  check_linear_gated_residual(x, weight, bias, residual, gate);
  return at::empty_symint(residual.sym_sizes(), residual.options().memory_format(at::MemoryFormat::Contiguous));
}

// residual + gate * y for the GEMM's fp32 output y [B, S, N] (the bias added), rounded once.
at::Tensor gated_sum(const at::Tensor& y, const at::Tensor& residual, const OptTensor& gate) {
  at::Tensor out = gate ? y.mul_(gate->to(at::kFloat)) : y;
  return out.add_(residual).to(residual.scalar_type()).contiguous();
}

at::Tensor linear_gated_residual_cpu(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                                     const at::Tensor& residual, const OptTensor& gate) {
  check_linear_gated_residual(x, weight, bias, residual, gate);
  const OptTensor bias32 = bias ? std::optional(bias->to(at::kFloat)) : std::nullopt;
  return gated_sum(at::linear(x.to(at::kFloat), weight.to(at::kFloat), bias32), residual, gate);
}

#ifdef LTX_KERNELS_WITH_CUDA
#ifdef LTX_KERNELS_SM90A
// Runs our Hopper kernel where it takes the arguments; false elsewhere.
bool launch_ours(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias, const at::Tensor& residual,
                 const OptTensor& gate, const at::Tensor& out) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(x.device().index());
  if (prop->major != 9 || x.scalar_type() == at::kFloat || x.size(2) % 8 != 0 || weight.size(0) % 8 != 0) {
    return false;
  }
  // TMA loads and stores 16-byte aligned rows: a misaligned operand is copied once (LTX's gate,
  // a [B, 1, N] view of its [B, 1, 6, N] modulation, is read in place).
  const at::Tensor a = aligned16(x.reshape({-1, x.size(2)})), w = aligned16(weight);
  const at::Tensor r = aligned16(residual.reshape({-1, residual.size(2)}));
  const OptTensor g = gate ? std::optional(aligned16(*gate)) : std::nullopt;
  const OptTensor b = bias ? std::optional(aligned16(*bias)) : std::nullopt;
  LinearGatedResidualParams p;
  p.dtype = to_dtype(x.scalar_type());
  p.m = a.size(0);
  p.n = w.size(0);
  p.k = w.size(1);
  p.a = a.const_data_ptr();
  p.a_row_stride = a.stride(0);
  p.b = w.const_data_ptr();
  p.b_row_stride = w.stride(0);
  p.bias = data_or_null(b);
  p.out = out.mutable_data_ptr();
  p.out_row_stride = p.n;
  p.residual = r.const_data_ptr();
  p.residual_row_stride = r.stride(0);
  p.gate = data_or_null(g);
  p.gate_batch_stride = g && g->dim() == 3 ? g->stride(0) : 0;
  p.batch_rows = x.size(1);
  p.arch = prop->major * 10 + prop->minor;
  check_core(p, "linear_gated_residual");
  if (cuda_support(p) != nullptr) return false;
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t bytes = workspace_bytes(p);
  const at::Tensor workspace = bytes > 0 ? at::empty({bytes}, x.options().dtype(at::kByte)) : at::Tensor();
  const cudaError_t error = launch(p, bytes > 0 ? workspace.data_ptr() : nullptr,
                                   c10::cuda::getCurrentCUDAStream(x.device().index()));
  TORCH_CHECK(error == cudaSuccess, "linear_gated_residual: CUDA launch failed: ", cudaGetErrorString(error));
  return true;
}
#endif

at::Tensor linear_gated_residual_cuda(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                                      const at::Tensor& residual, const OptTensor& gate) {
  check_linear_gated_residual(x, weight, bias, residual, gate);
  if (residual.numel() == 0) return at::empty(residual.sizes(), residual.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.scalar_type() == at::kBFloat16) {
    check_compute_capability(x, 80, "linear_gated_residual",
                             "has no bfloat16 arithmetic (Ampere and newer have it): use float16 or float32");
  }
#ifdef LTX_KERNELS_SM90A
  if (x.size(2) > 0) {
    const at::Tensor out = at::empty(residual.sizes(), residual.options().memory_format(at::MemoryFormat::Contiguous));
    if (launch_ours(x, weight, bias, residual, gate, out)) return out;
  }
#endif
  // Other GPUs and arguments: cuBLAS's GEMM into fp32 (no rounding of y), then the residual.
  const at::Tensor x2d = x.reshape({x.size(0) * x.size(1), x.size(2)});  // (not -1: k may be 0)
  at::Tensor y = x.scalar_type() == at::kFloat || x.size(2) == 0 ? at::mm(x2d.to(at::kFloat), weight.to(at::kFloat).t())
                                                                  : at::mm(x2d, weight.t(), at::kFloat);
  if (bias) y.add_(bias->to(at::kFloat));
  return gated_sum(y.view(residual.sizes()), residual, gate);
}
#endif

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) { LTX_KERNELS_IMPL(m, "linear_gated_residual", linear_gated_residual_cpu); }
LTX_KERNELS_LIBRARY_IMPL(Meta, m) { LTX_KERNELS_IMPL(m, "linear_gated_residual", linear_gated_residual_meta); }
#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) { LTX_KERNELS_IMPL(m, "linear_gated_residual", linear_gated_residual_cuda); }
#endif

}  // namespace ltx_kernels::torch_ext

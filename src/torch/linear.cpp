// linear_gelu_tanh: gelu_tanh(x @ weight.T + bias), the first half of a GELU-tanh
// feed-forward (diffusers' GELU(approximate="tanh") module, LTX-Video's FF).
//
// On CUDA, in 16 bits, the activation runs in the GEMM's epilogue (cuBLASLt GELU_BIAS through
// at::_addmm_activation, which applies the tanh form, and falls back to addmm + the tanh GELU
// when cuBLASLt cannot take the shapes): the [tokens, 4D] activation, the largest tensor of
// the block, is written once instead of written, read and written again. Being one opaque
// op also keeps the fusion under torch.compile, whose decomposition would split it.
// CPU (the GEMM in fp32, rounded once: linear_rounded_once), and fp32 on CUDA: the GEMM, then
// our gelu_tanh, whose C++ reference and kernel keep the negative tail (at::gelu's tanh form
// flushes it: -0 for -5.5e-10 at an input of -5.79; at::_addmm_activation's CPU path applies
// the exact GELU).
#include <ATen/ATen.h>
#include "torch/registration.h"

#include "common.h"
#include "torch/op_checks.h"

namespace ltx_kernels::torch_ext {

void check_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_activation(x, "x");
  TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type() && bias.scalar_type() == x.scalar_type(),
                   "weight and bias must have x's dtype ", x.scalar_type(), ", got ",
                   weight.scalar_type(), " and ", bias.scalar_type());
  TORCH_CHECK_VALUE(weight.device() == x.device() && bias.device() == x.device(),
                    "weight and bias must be on x's device ", device_str(x.device()), ", got ",
                    device_str(weight.device()), " and ", device_str(bias.device()));
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.sym_size(1) == x.sym_size(-1),
                    "weight must be [N, K] with K = x's last dim (x ", dims_str(x.sym_sizes()),
                    "), got ", dims_str(weight.sym_sizes()));
  TORCH_CHECK_VALUE(bias.dim() == 1 && bias.sym_size(0) == weight.sym_size(0),
                    "bias must be [N] with N = weight.size(0) (weight ", dims_str(weight.sym_sizes()),
                    "), got ", dims_str(bias.sym_sizes()));
}

namespace {

std::vector<c10::SymInt> out_sizes(const at::Tensor& x, const at::Tensor& weight) {
  std::vector<c10::SymInt> sizes(x.sym_sizes().begin(), x.sym_sizes().end());
  sizes.back() = weight.sym_size(0);
  return sizes;
}

at::Tensor linear_gelu_tanh_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_linear(x, weight, bias);
  return gelu_tanh(linear_rounded_once(x, weight, bias));
}

at::Tensor linear_gelu_tanh_meta(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_linear(x, weight, bias);
  return at::empty_symint(out_sizes(x, weight), x.options());
}

#ifdef LTX_KERNELS_WITH_CUDA
at::Tensor linear_gelu_tanh_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_linear(x, weight, bias);
  // cuBLASLt's epilogue evaluates 0.5 h (1 + tanh u) in fp32 (as torch's own CUDA GELU does):
  // the cancellation in 1 + tanh costs up to ~1e-4 of the value near h = -3.5 and gives 0 below
  // h ~ -5 (the value is < 1e-9 |h|). A 16-bit output's rounding is far coarser; an fp32 one's
  // is not, so fp32 takes the GEMM, then our gelu_tanh, accurate in that tail.
  if (x.scalar_type() == at::kFloat) return gelu_tanh(at::linear(x, weight, bias));
  const at::Tensor x2d = x.reshape({-1, x.size(-1)});
  const at::Tensor out = at::_addmm_activation(bias, x2d, weight.t(), 1, 1, /*use_gelu=*/true);
  return out.view_symint(out_sizes(x, weight));
}
#endif

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) { LTX_KERNELS_IMPL(m, "linear_gelu_tanh", linear_gelu_tanh_cpu); }
LTX_KERNELS_LIBRARY_IMPL(Meta, m) { LTX_KERNELS_IMPL(m, "linear_gelu_tanh", linear_gelu_tanh_meta); }
#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) { LTX_KERNELS_IMPL(m, "linear_gelu_tanh", linear_gelu_tanh_cuda); }
#endif

}  // namespace ltx_kernels::torch_ext

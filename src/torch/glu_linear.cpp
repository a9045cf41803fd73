// glu_linear: (act(a) * b) @ weight^T + bias, a gated MLP's activation and down projection (a
// Llama MLP: down_proj(silu(gate_proj(x)) * up_proj(x))) as one differentiable op.
//
// Why one op: autograd of the activation, then a Linear, keeps three [tokens, intermediate]
// tensors for the backward, a and b (the activation's inputs) and h = act(a) * b (the Linear's
// input, for its weight gradient). h is cheap to recompute from a and b, so this op's backward
// does that and autograd keeps a and b only: 1/3 of an LLM's MLP activations (for Llama-3-8B,
// 1.75 of the ~17 hidden states a token that a layer keeps), for one elementwise pass more.
// The forward is what the two ops compute: our *_and_mul op, then at::linear (cuBLAS on CUDA);
// the backward's GEMMs and rounding are those of torch's autograd of Linear.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

#include "torch/backward.h"
#include "torch/common.h"
#include "torch/registration.h"

namespace ltx_kernels::torch_ext {
namespace {

// The *_and_mul op of `activation`, and its backward, through the dispatcher (CPU, CUDA, Meta).
std::string and_mul_op(c10::string_view activation) {
  TORCH_CHECK_VALUE(activation == "silu" || activation == "gelu_tanh" || activation == "gelu",
                    "activation must be 'silu', 'gelu_tanh' or 'gelu', got '", std::string(activation), "'");
  return std::string(LTX_KERNELS_OPS_NAMESPACE_STR "::") + std::string(activation) + "_and_mul";
}

at::Tensor and_mul(c10::string_view activation, const at::Tensor& a, const at::Tensor& b) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(and_mul_op(activation).c_str(), "")
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>()
      .call(a, b);
}

Grads2 and_mul_backward(c10::string_view activation, const at::Tensor& grad_h, const at::Tensor& a,
                        const at::Tensor& b) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow((and_mul_op(activation) + "_backward").c_str(), "")
      .typed<Grads2(const at::Tensor&, const at::Tensor&, const at::Tensor&)>()
      .call(grad_h, a, b);
}

void check_glu_linear(const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight, const OptTensor& bias,
                      c10::string_view activation) {
  and_mul_op(activation);
  check_activation(a, "a");
  check_like(b, "b", a, "a");
  TORCH_CHECK_TYPE(weight.scalar_type() == a.scalar_type(), "weight must have the dtype of a (", a.scalar_type(),
                   "), got ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.device() == a.device(), "weight must be on the device of a (", device_str(a.device()),
                    "), got ", device_str(weight.device()));
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.sym_size(1) == a.sym_size(-1),
                    "weight must be [N, K] with K = a's last dim (a ", dims_str(a.sym_sizes()), "), got ",
                    dims_str(weight.sym_sizes()));
  if (!bias) return;
  TORCH_CHECK_TYPE(bias->scalar_type() == a.scalar_type(), "bias must have the dtype of a (", a.scalar_type(),
                   "), got ", bias->scalar_type());
  TORCH_CHECK_VALUE(bias->device() == a.device(), "bias must be on the device of a (", device_str(a.device()),
                    "), got ", device_str(bias->device()));
  TORCH_CHECK_VALUE(bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0),
                    "bias must be [N] with N = weight.size(0) (weight ", dims_str(weight.sym_sizes()), "), got ",
                    dims_str(bias->sym_sizes()));
}

at::Tensor glu_linear(const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight, const OptTensor& bias,
                      c10::string_view activation) {
  check_glu_linear(a, b, weight, bias, activation);
  return at::linear(and_mul(activation, a, b), weight, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> glu_linear_backward(
    const at::Tensor& grad_out, const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight,
    const OptTensor& bias, c10::string_view activation) {
  check_glu_linear(a, b, weight, bias, activation);
  check_linear_grad(grad_out, a, "a", weight);
  const at::Tensor h = and_mul(activation, a, b);  // recomputed: the forward did not keep it
  const at::Tensor g2 = grad_out.reshape_symint({-1, weight.sym_size(0)});
  const at::Tensor grad_weight = at::mm(g2.t(), h.reshape_symint({-1, weight.sym_size(1)}));
  const at::Tensor grad_bias = bias ? g2.sum(0).to(bias->scalar_type()) : none_grad(a);
  const auto [grad_a, grad_b] = and_mul_backward(activation, at::matmul(grad_out, weight), a, b);
  return {grad_a, grad_b, grad_weight, grad_bias};
}

void register_impls(torch::Library& m) {
  LTX_KERNELS_IMPL(m, "glu_linear", glu_linear);
  LTX_KERNELS_IMPL(m, "glu_linear_backward", glu_linear_backward);
}

}  // namespace

// One composition for every device: the parts dispatch to their own CPU, CUDA and Meta kernels.
LTX_KERNELS_LIBRARY_IMPL(CPU, m) { register_impls(m); }
LTX_KERNELS_LIBRARY_IMPL(Meta, m) { register_impls(m); }
#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) { register_impls(m); }
#endif

}  // namespace ltx_kernels::torch_ext

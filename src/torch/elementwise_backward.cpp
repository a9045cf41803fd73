// Backward ops of gated_residual, linear_gelu_tanh and linear_gated_residual (the `<op>_backward`
// of autograd.cpp):
// the gradients of the outputs, then the forward's arguments; one gradient per tensor
// argument (but x's of gated_residual and residual's of linear_gated_residual: grad_out itself,
// which autograd passes on, gradient_is in schemas.cpp), an empty tensor for an absent optional
// one. Written with ATen ops (and
// gelu_tanh_backward's kernel), so one implementation serves CPU, CUDA and Meta. The
// activations' own backward ops are kernels of the elementwise family (elementwise.cpp).
#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

#include "torch/backward.h"
#include "torch/common.h"
#include "torch/op_checks.h"
#include "torch/registration.h"

namespace ltx_kernels::torch_ext {
namespace {

at::Tensor call_gelu_tanh_backward(const at::Tensor& grad_out, const at::Tensor& h) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(LTX_KERNELS_OPS_NAMESPACE_STR "::gelu_tanh_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad_out, h);
}

// out = x + y * gate: the gradients of y and gate (x's is grad_out). ATen multiplies 16-bit
// tensors in fp32 and rounds once, so grad_out * gate needs no fp32 copies of its operands (the
// same values as f32(grad_out) * f32(gate) rounded, in one pass); the gate's sum is fp32.
Grads2 gated_residual_backward(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& y,
                               const OptTensor& gate) {
  check_gated_residual(x, y, gate);
  check_grad(grad_out, "grad_out", x, x.scalar_type());
  if (!gate) return {fresh_grad(grad_out, y.scalar_type()), none_grad(x)};
  return {grad_as(grad_out * *gate, y.scalar_type()), reduce_like(f32(grad_out) * y, *gate)};
}

// out = gelu_tanh(h), h = x @ weight^T + bias, recomputed in x's dtype; the GEMMs of the
// gradients in that dtype too, as torch's autograd of Linear + GELU runs them.
Grads3 linear_gelu_tanh_backward(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& bias) {
  check_linear(x, weight, bias);
  check_linear_grad(grad_out, x, "x", weight);
  const at::Tensor dh = call_gelu_tanh_backward(grad_out, linear_rounded_once(x, weight, bias));
  const at::Tensor dh2 = dh.reshape({-1, weight.size(0)});
  return {at::matmul(dh, weight), at::mm(dh2.t(), x.reshape({-1, weight.size(1)})), dh2.sum(0).to(bias.scalar_type())};
}

// out = residual + gate * y, y = x @ weight^T + bias, recomputed in x's dtype (as the gradient
// of the gate sees y in the unfused linear + gated_residual); dy = gate * grad_out rounded to
// x's dtype, then the GEMMs of the gradients in that dtype, as torch's autograd of Linear runs
// them. (residual's gradient is grad_out.)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_gated_residual_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
    const at::Tensor& residual, const OptTensor& gate) {
  check_linear_gated_residual(x, weight, bias, residual, gate);
  TORCH_CHECK_TYPE(grad_out.scalar_type() == x.scalar_type(), "grad_out must have x's dtype (", x.scalar_type(),
                   "), got ", grad_out.scalar_type());
  TORCH_CHECK_VALUE(grad_out.device() == x.device() && grad_out.sym_sizes() == residual.sym_sizes(),
                    "grad_out must be on x's device with the output's shape ", dims_str(residual.sym_sizes()),
                    ", got ", dims_str(grad_out.sym_sizes()), " on ", device_str(grad_out.device()));
  const at::ScalarType dtype = x.scalar_type();
  const at::Tensor dy = grad_as(gate ? grad_out * *gate : grad_out, dtype);  // (as gated_residual_backward's)
  const c10::SymInt rows = x.sym_size(0) * x.sym_size(1);  // (not -1 in the reshapes: n or k may be 0)
  const at::Tensor dy2 = dy.reshape_symint({rows, weight.sym_size(0)});
  return {at::matmul(dy, weight).contiguous(), at::mm(dy2.t(), x.reshape_symint({rows, weight.sym_size(1)})),
          bias ? grad_as(at::sum(dy2, {0}, false, at::kFloat), dtype) : none_grad(x),
          gate ? reduce_like(f32(grad_out) * linear_rounded_once(x, weight, bias), *gate) : none_grad(x)};
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  LTX_KERNELS_IMPL(m, "gated_residual_backward", gated_residual_backward);
  LTX_KERNELS_IMPL(m, "linear_gelu_tanh_backward", linear_gelu_tanh_backward);
  LTX_KERNELS_IMPL(m, "linear_gated_residual_backward", linear_gated_residual_backward);
}

}  // namespace ltx_kernels::torch_ext

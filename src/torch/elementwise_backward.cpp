// Backward ops of the elementwise family and linear_gelu_tanh (the `<op>_backward` of
// autograd.cpp): the gradients of the outputs, then the forward's arguments; one gradient per
// tensor argument, an empty tensor for an absent optional one. Activations are recomputed
// from their input, not saved.
//
// Written with ATen ops, so one implementation serves CPU, CUDA and Meta (torch.compile) and
// is the reference the fused CUDA backward kernels will be tested against.
#include <c10/util/string_view.h>

#include <cmath>
#include <tuple>

#include "torch/backward.h"
#include "torch/registration.h"

namespace ltx_kernels::torch_ext {
namespace {

enum class Activation { kGeluTanh, kGelu, kSilu };

// An activation and its derivative at a (fp32), in the forms without cancellation for large
// negative a that the kernels use (src/core/activation.cuh): GELU-tanh = a sigmoid(2u),
// GELU = a Phi(a) with Phi = erfc(-a / sqrt 2) / 2, SiLU = a sigmoid(a).
std::pair<at::Tensor, at::Tensor> activation(Activation kind, const at::Tensor& a) {
  if (kind == Activation::kGelu) {
    const at::Tensor phi = at::erfc(a * -M_SQRT1_2) * 0.5;
    return {a * phi, phi + a * at::exp(a.square() * -0.5) * (0.5 * M_2_SQRTPI * M_SQRT1_2)};
  }
  const double k = kind == Activation::kGeluTanh ? 2.0 * std::sqrt(2.0 / M_PI) : 1.0;
  const double c = kind == Activation::kGeluTanh ? 0.044715 : 0.0;
  const at::Tensor s = at::sigmoid((a + c * a.pow(3)) * k);
  const at::Tensor dz = (c * 3.0 * a.square() + 1.0) * k;  // d(2u)/da
  return {a * s, s + a * s * (1.0 - s) * dz};
}

at::Tensor gelu_tanh_backward(const at::Tensor& grad_out, const at::Tensor& x) {
  return (f32(grad_out) * activation(Activation::kGeluTanh, f32(x)).second).to(x.scalar_type());
}

// out = act(a) * b.
Grads2 act_and_mul_backward(Activation kind, const at::Tensor& grad_out, const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor g = f32(grad_out);
  const auto [value, slope] = activation(kind, f32(a));
  return {(g * f32(b) * slope).to(a.scalar_type()), (g * value).to(b.scalar_type())};
}

Grads2 gelu_tanh_and_mul_backward(const at::Tensor& grad_out, const at::Tensor& a, const at::Tensor& b) {
  return act_and_mul_backward(Activation::kGeluTanh, grad_out, a, b);
}

Grads2 gelu_and_mul_backward(const at::Tensor& grad_out, const at::Tensor& a, const at::Tensor& b) {
  return act_and_mul_backward(Activation::kGelu, grad_out, a, b);
}

Grads2 silu_and_mul_backward(const at::Tensor& grad_out, const at::Tensor& a, const at::Tensor& b) {
  return act_and_mul_backward(Activation::kSilu, grad_out, a, b);
}

// x = [a | b] along the last dim: the two halves' gradients side by side.
at::Tensor concatenated_backward(Activation kind, const at::Tensor& grad_out, const at::Tensor& x) {
  const auto halves = x.chunk(2, -1);
  const auto [da, db] = act_and_mul_backward(kind, grad_out, halves[0], halves[1]);
  return at::cat({da, db}, -1);
}

at::Tensor geglu_backward(const at::Tensor& grad_out, const at::Tensor& x, c10::string_view approximate) {
  return concatenated_backward(approximate == "tanh" ? Activation::kGeluTanh : Activation::kGelu, grad_out, x);
}

at::Tensor swiglu_backward(const at::Tensor& grad_out, const at::Tensor& x) {
  return concatenated_backward(Activation::kSilu, grad_out, x);
}

// out = x + y * gate.
Grads3 gated_residual_backward(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& y,
                               const OptTensor& gate) {
  const at::Tensor g = f32(grad_out);
  return {grad_out.to(x.scalar_type()), (gate ? g * f32(*gate) : g).to(y.scalar_type()),
          gate ? reduce_like(g * f32(y), *gate) : none_grad(x)};
}

// out = gelu_tanh(h), h = x @ weight^T + bias, recomputed in x's dtype; the GEMMs of the
// gradients in that dtype too, as torch's autograd of Linear + GELU runs them.
Grads3 linear_gelu_tanh_backward(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& bias) {
  const at::Tensor h = at::linear(x, weight, bias);
  const at::Tensor dh = (f32(grad_out) * activation(Activation::kGeluTanh, f32(h)).second).to(x.scalar_type());
  const at::Tensor dh2 = dh.reshape({-1, weight.size(0)});
  return {at::matmul(dh, weight), at::mm(dh2.t(), x.reshape({-1, weight.size(1)})), dh2.sum(0).to(bias.scalar_type())};
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  m.impl("gelu_tanh_backward", &gelu_tanh_backward);
  m.impl("gelu_tanh_and_mul_backward", &gelu_tanh_and_mul_backward);
  m.impl("gelu_and_mul_backward", &gelu_and_mul_backward);
  m.impl("silu_and_mul_backward", &silu_and_mul_backward);
  m.impl("geglu_backward", &geglu_backward);
  m.impl("swiglu_backward", &swiglu_backward);
  m.impl("gated_residual_backward", &gated_residual_backward);
  m.impl("linear_gelu_tanh_backward", &linear_gelu_tanh_backward);
}

}  // namespace ltx_kernels::torch_ext

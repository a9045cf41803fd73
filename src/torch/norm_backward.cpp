// Backward ops of the norm family (the `<op>_backward` of autograd.cpp): the gradients of the
// outputs, then the forward's arguments; one gradient per tensor argument, an empty tensor for
// an absent optional one. The row statistics are recomputed from x (one reduction) rather
// than saved.
//
// Written with ATen ops, so one implementation serves CPU, CUDA and Meta (torch.compile) and
// is the reference the fused CUDA backward kernels will be tested against.
#include "torch/backward.h"
#include "torch/registration.h"

namespace ltx_kernels::torch_ext {
namespace {

// x normalized as the forward does it (centered for LayerNorm), in fp32, with its 1 / std.
struct Normalized {
  at::Tensor xhat;
  at::Tensor rstd;
};

Normalized normalized_fp32(const at::Tensor& x, bool center, double eps) {
  at::Tensor xf = f32(x);
  if (center) xf = xf - xf.mean(-1, true);
  const at::Tensor rstd = at::rsqrt(xf.square().mean(-1, true) + eps);
  return {xf * rstd, rstd};
}

// d loss / d x from d loss / d xhat (fp32): the projection that removes the components along
// xhat (and, centered, along the constant row) that the normalization cannot change.
at::Tensor normalize_backward(const at::Tensor& dxhat, const Normalized& n, bool center) {
  at::Tensor d = dxhat - n.xhat * (dxhat * n.xhat).mean(-1, true);
  if (center) d = d - dxhat.mean(-1, true);
  return d * n.rstd;
}

// The affine norm y = xhat * (weight + weight_offset) + bias: grads of x, weight and bias
// from dy (fp32); dx in fp32.
Grads3 affine_norm_backward(const at::Tensor& dy, const at::Tensor& x, const OptTensor& weight,
                            const OptTensor& bias, bool center, double eps, double weight_offset) {
  const Normalized n = normalized_fp32(x, center, eps);
  const at::Tensor dxhat = weight ? dy * (f32(*weight) + weight_offset) : dy;
  return {normalize_backward(dxhat, n, center), weight ? reduce_like(dy * n.xhat, *weight) : none_grad(x),
          bias ? reduce_like(dy, *bias) : none_grad(x)};
}

// y = norm(x) * (1 + scale) + shift: dy of the norm, grad of scale and of shift, from the
// output gradient g (fp32) and the norm's output (fp32, recomputed).
Grads3 modulation_backward(const at::Tensor& g, const at::Tensor& normed, const at::Tensor& scale,
                           const at::Tensor& shift) {
  return {g * (f32(scale) + 1.0), reduce_like(g * normed, scale), reduce_like(g, shift)};
}

at::Tensor norm_output(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias, bool center,
                       double eps) {
  at::Tensor y = normalized_fp32(x, center, eps).xhat;
  if (weight) y = y * f32(*weight);
  if (bias) y = y + f32(*bias);
  return y;
}

Grads2 rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& x, const OptTensor& weight, double eps,
                         double weight_offset, std::optional<at::ScalarType> /*out_dtype: grad_out's*/) {
  const auto [dx, dw, db] = affine_norm_backward(f32(grad_out), x, weight, std::nullopt, false, eps, weight_offset);
  return {dx.to(x.scalar_type()), dw};
}

Grads3 layer_norm_backward(const at::Tensor& grad_out, const at::Tensor& x, const OptTensor& weight,
                           const OptTensor& bias, double eps) {
  const auto [dx, dw, db] = affine_norm_backward(f32(grad_out), x, weight, bias, true, eps, 0.0);
  return {dx.to(x.scalar_type()), dw, db};
}

// new_residual = x + residual (rounded to the dtype, the value the norm reads), out =
// rms_norm(new_residual): both inputs get the sum of the two paths' gradients.
Grads3 fused_add_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& grad_new_residual,
                                   const at::Tensor& x, const at::Tensor& residual, const OptTensor& weight,
                                   double eps, double weight_offset) {
  const at::Tensor h = (f32(x) + f32(residual)).to(x.scalar_type());
  const auto [dh, dw, db] = affine_norm_backward(f32(grad_out), h, weight, std::nullopt, false, eps, weight_offset);
  const at::Tensor d = dh + f32(grad_new_residual);
  return {d.to(x.scalar_type()), d.to(residual.scalar_type()), dw};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> adaln_rms_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
    const OptTensor& weight, double eps) {
  const auto [dnorm, dscale, dshift] =
      modulation_backward(f32(grad_out), norm_output(x, weight, std::nullopt, false, eps), scale, shift);
  const auto [dx, dw, db] = affine_norm_backward(dnorm, x, weight, std::nullopt, false, eps, 0.0);
  return {dx.to(x.scalar_type()), dscale, dshift, dw};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> adaln_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
    const OptTensor& weight, const OptTensor& bias, double eps) {
  const auto [dnorm, dscale, dshift] =
      modulation_backward(f32(grad_out), norm_output(x, weight, bias, true, eps), scale, shift);
  const auto [dx, dw, db] = affine_norm_backward(dnorm, x, weight, bias, true, eps, 0.0);
  return {dx.to(x.scalar_type()), dscale, dshift, dw, db};
}

// x_new = x + y * gate (rounded to the dtype), normed = adaln_rms_norm(x_new): x_new's
// gradient is its own plus the norm's, and flows to x, y and gate.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
gated_residual_adaln_rms_norm_backward(const at::Tensor& grad_x_new, const at::Tensor& grad_normed,
                                       const at::Tensor& x, const at::Tensor& y, const OptTensor& gate,
                                       const at::Tensor& scale, const at::Tensor& shift, const OptTensor& weight,
                                       double eps) {
  const at::Tensor yg = gate ? f32(y) * f32(*gate) : f32(y);
  const at::Tensor x_new = (f32(x) + yg).to(x.scalar_type());
  const auto [dnorm, dscale, dshift] =
      modulation_backward(f32(grad_normed), norm_output(x_new, weight, std::nullopt, false, eps), scale, shift);
  const auto [dh, dw, db] = affine_norm_backward(dnorm, x_new, weight, std::nullopt, false, eps, 0.0);
  const at::Tensor d = dh + f32(grad_x_new);
  return {d.to(x.scalar_type()), (gate ? d * f32(*gate) : d).to(y.scalar_type()),
          gate ? reduce_like(d * f32(y), *gate) : none_grad(x), dscale, dshift, dw};
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  m.impl("rms_norm_backward", &rms_norm_backward);
  m.impl("layer_norm_backward", &layer_norm_backward);
  m.impl("fused_add_rms_norm_backward", &fused_add_rms_norm_backward);
  m.impl("adaln_rms_norm_backward", &adaln_rms_norm_backward);
  m.impl("adaln_layer_norm_backward", &adaln_layer_norm_backward);
  m.impl("gated_residual_adaln_rms_norm_backward", &gated_residual_adaln_rms_norm_backward);
}

}  // namespace ltx_kernels::torch_ext

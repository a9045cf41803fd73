// Backward ops of the norm family (the `<op>_backward` of autograd.cpp): the gradients of the
// outputs, then the forward's arguments; one gradient per tensor argument, an empty tensor for
// an absent optional one. The row statistics are recomputed from x (one reduction) rather
// than saved.
//
// rms_norm, layer_norm, fused_add_rms_norm and adaln_layer_norm: written with ATen ops, so one
// implementation serves CPU, CUDA and Meta (torch.compile); on CUDA, the first three run the
// fused kernel instead (ltx_kernels/norm_backward.h) whenever its form applies: grad_out in x's
// dtype and a row that fits in registers (norm_backward_supported); the composition otherwise.
// adaln_rms_norm and gated_residual_adaln_rms_norm: one pass per row on every device
// (ltx_kernels/adaln_backward.h: C++ reference on the CPU, a kernel on CUDA), Meta shapes apart.
#include <algorithm>

#include "ltx_kernels/adaln_backward.h"
#include "torch/backward.h"
#include "torch/common.h"
#include "torch/op_checks.h"
#include "torch/registration.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>

#include "ltx_kernels/norm_backward.h"
#endif

namespace ltx_kernels::torch_ext {
namespace {

// x normalized as the forward does it (centered for LayerNorm), in fp32, with its 1 / std.
struct Normalized {
  at::Tensor xhat;
  at::Tensor rstd;
};

Normalized normalized_fp32(const at::Tensor& x, bool center, double eps) {
  at::Tensor xf = f32(x);
  // Centred on each row's first element first, as the forward does: for a row like 1e3 +- 1e-2
  // the shifted values are exact and small, so their fp32 mean is too (the row's own mean is
  // off by ~1e-4, a percent of the spread, which the gradient through rstd amplifies).
  if (center) xf = xf - xf.narrow(-1, 0, 1);
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

// The forward's checks of its arguments and the gradients' dtype, device and shape: for a
// direct call of a backward op (autograd passes the forward's own, valid, arguments).
void check_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& x, const OptTensor& weight, double eps,
                             std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType out_type = norm_out_dtype("rms_norm_backward", x, out_dtype);
  check_norm_args("rms_norm_backward", x, nullptr, weight, std::nullopt, eps, Params::kLikeXOrFloat32, out_type);
  check_grad(grad_out, "grad_out", x, out_type);
}

void check_layer_norm_backward(const at::Tensor& grad_out, const at::Tensor& x, const OptTensor& weight,
                               const OptTensor& bias, double eps) {
  check_norm_args("layer_norm_backward", x, nullptr, weight, bias, eps, Params::kLikeXOrFloat32);
  check_grad(grad_out, "grad_out", x, x.scalar_type());
}

// x and residual are None when autograd calls it (save_only_when in schemas.cpp: the saved
// new_residual serves instead); given, they must add up to new_residual's shape and dtype.
void check_fused_add_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& grad_new_residual,
                                       const OptTensor& x, const OptTensor& residual, const OptTensor& weight,
                                       double eps, const at::Tensor& new_residual) {
  // new_residual first, by its name: check_norm_args calls its x argument x.
  check_activation(new_residual, "new_residual");
  check_grad(grad_out, "grad_out", new_residual, new_residual.scalar_type(), "new_residual");
  check_grad(grad_new_residual, "grad_new_residual", new_residual, new_residual.scalar_type(), "new_residual");
  if (x) check_like(*x, "x", new_residual, "new_residual");
  if (residual) check_like(*residual, "residual", new_residual, "new_residual");
  check_norm_args("fused_add_rms_norm_backward", new_residual, nullptr, weight, std::nullopt, eps,
                  Params::kLikeXOrFloat32);
}

Grads2 rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& x, const OptTensor& weight, double eps,
                         double weight_offset, std::optional<at::ScalarType> out_dtype) {
  check_rms_norm_backward(grad_out, x, weight, eps, out_dtype);
  const auto [dx, dw, db] = affine_norm_backward(f32(grad_out), x, weight, std::nullopt, false, eps, weight_offset);
  return {grad_as(dx, x.scalar_type()), dw};
}

Grads3 layer_norm_backward(const at::Tensor& grad_out, const at::Tensor& x, const OptTensor& weight,
                           const OptTensor& bias, double eps) {
  check_layer_norm_backward(grad_out, x, weight, bias, eps);
  const auto [dx, dw, db] = affine_norm_backward(f32(grad_out), x, weight, bias, true, eps, 0.0);
  return {grad_as(dx, x.scalar_type()), dw, db};
}

// new_residual = x + residual (rounded to the dtype, the value the norm reads), out =
// rms_norm(new_residual): both inputs get the sum of the two paths' gradients, returned once
// (x's; autograd gives residual the same tensor: shares_gradient in schemas.cpp).
Grads2 fused_add_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& grad_new_residual,
                                   const OptTensor& x, const OptTensor& residual, const OptTensor& weight,
                                   double eps, double weight_offset, const at::Tensor& new_residual) {
  check_fused_add_rms_norm_backward(grad_out, grad_new_residual, x, residual, weight, eps, new_residual);
  const at::ScalarType dtype = new_residual.scalar_type();
  const auto [dh, dw, db] =
      affine_norm_backward(f32(grad_out), new_residual, weight, std::nullopt, false, eps, weight_offset);
  return {grad_as(dh + f32(grad_new_residual), dtype), dw};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> adaln_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
    const OptTensor& weight, const OptTensor& bias, double eps) {
  check_norm_args("adaln_layer_norm_backward", x, nullptr, weight, bias, eps);
  check_modulation(x, &scale, &shift);
  check_grad(grad_out, "grad_out", x, x.scalar_type());
  const auto [dnorm, dscale, dshift] =
      modulation_backward(f32(grad_out), norm_output(x, weight, bias, true, eps), scale, shift);
  const auto [dx, dw, db] = affine_norm_backward(dnorm, x, weight, bias, true, eps, 0.0);
  return {grad_as(dx, x.scalar_type()), dscale, dshift, dw, db};
}

void check_adaln_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& scale,
                                   const at::Tensor& shift, const OptTensor& weight, double eps) {
  check_norm_args("adaln_rms_norm_backward", x, nullptr, weight, std::nullopt, eps);
  check_modulation(x, &scale, &shift);
  check_grad(grad_out, "grad_out", x, x.scalar_type());
}

void check_gated_residual_adaln_rms_norm_backward(const at::Tensor& grad_x_new, const at::Tensor& grad_normed,
                                                  const at::Tensor& x, const at::Tensor& y, const OptTensor& gate,
                                                  const at::Tensor& scale, const at::Tensor& shift,
                                                  const OptTensor& weight, double eps) {
  check_norm_args("gated_residual_adaln_rms_norm_backward", x, nullptr, weight, std::nullopt, eps);
  check_like(y, "y", x, "x");
  if (gate) check_row_vectors(*gate, "gate", x);
  check_modulation(x, &scale, &shift);
  check_grad(grad_x_new, "grad_x_new", x, x.scalar_type());
  check_grad(grad_normed, "grad_normed", x, x.scalar_type());
}

// The AdaLN RMS norms' backward (include/ltx_kernels/adaln_backward.h): one pass per row, the C++
// reference on the CPU and the kernel on CUDA, then the broadcast arguments' gradients summed
// from its fp32 terms (scale's, weight's, gate's) and from g (shift's).
struct AdalnRows {
  at::Tensor dx, dy, gn, dw, dg;
};

AdalnRows adaln_backward_rows(const char* op, const at::Tensor& grad_out, const at::Tensor* grad_h,
                              const at::Tensor& x, const at::Tensor* y, const OptTensor& gate,
                              const at::Tensor& scale, const OptTensor& weight, double eps) {
  const Rows xr = as_rows(x), gr = as_rows(last_dim_contiguous(grad_out));
  AdalnBackwardParams p;
  p.dtype = to_dtype(x.scalar_type());
  p.rows = xr.rows;
  p.cols = xr.cols;
  p.eps = static_cast<float>(eps);
  p.tokens = std::max<int64_t>(1, xr.rows / batches_of(x));
  p.x = xr.tensor.const_data_ptr();
  p.x_row_stride = xr.row_stride;
  p.grad_out = gr.tensor.const_data_ptr();
  p.grad_out_row_stride = gr.row_stride;
  at::Tensor keep[2];
  p.scale = row_vectors(scale, x, keep[0]);
  const at::TensorOptions f32_options = x.options().dtype(at::kFloat);
  AdalnRows out{at::empty(x.sizes(), x.options()), at::Tensor(), at::empty({xr.rows, xr.cols}, f32_options)};
  p.dx = out.dx.mutable_data_ptr();
  p.dx_row_stride = xr.cols;
  p.gn = out.gn.mutable_data_ptr<float>();
  at::Tensor w32;
  if (weight) {
    w32 = f32(*weight).contiguous();
    p.weight = w32.const_data_ptr<float>();
    out.dw = at::empty({xr.rows, xr.cols}, f32_options);
    p.dw = out.dw.mutable_data_ptr<float>();
  }
  Rows yr, hr;
  if (y) {
    yr = as_rows(*y);
    hr = as_rows(last_dim_contiguous(*grad_h));
    p.y = yr.tensor.const_data_ptr();
    p.y_row_stride = yr.row_stride;
    p.grad_h = hr.tensor.const_data_ptr();
    p.grad_h_row_stride = hr.row_stride;
    out.dy = at::empty(x.sizes(), y->options());
    p.dy = out.dy.mutable_data_ptr();
    p.dy_row_stride = xr.cols;
    if (gate) {
      p.gate = row_vectors(*gate, x, keep[1]);
      out.dg = at::empty({xr.rows, xr.cols}, f32_options);
      p.dg = out.dg.mutable_data_ptr<float>();
    }
  }
  if (xr.rows > 0 && xr.cols > 0) run(p, x, op);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> adaln_rms_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
    const OptTensor& weight, double eps) {
  constexpr const char* kOp = "adaln_rms_norm_backward";
  check_adaln_rms_norm_backward(grad_out, x, scale, shift, weight, eps);
  const AdalnRows r = adaln_backward_rows(kOp, grad_out, nullptr, x, nullptr, std::nullopt, scale, weight, eps);
  return {r.dx, reduce_like(r.gn.view(x.sizes()), scale), reduce_like(grad_out, shift),
          weight ? reduce_like(r.dw.view(x.sizes()), *weight) : none_grad(x)};
}

// x_new = x + y * gate (rounded to the dtype), normed = adaln_rms_norm(x_new): x_new's
// gradient is its own plus the norm's, and flows to x, y and gate.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
gated_residual_adaln_rms_norm_backward(const at::Tensor& grad_x_new, const at::Tensor& grad_normed,
                                       const at::Tensor& x, const at::Tensor& y, const OptTensor& gate,
                                       const at::Tensor& scale, const at::Tensor& shift, const OptTensor& weight,
                                       double eps) {
  constexpr const char* kOp = "gated_residual_adaln_rms_norm_backward";
  check_gated_residual_adaln_rms_norm_backward(grad_x_new, grad_normed, x, y, gate, scale, shift, weight, eps);
  const AdalnRows r = adaln_backward_rows(kOp, grad_normed, &grad_x_new, x, &y, gate, scale, weight, eps);
  return {r.dx, r.dy, gate ? reduce_like(r.dg.view(x.sizes()), *gate) : none_grad(x),
          reduce_like(r.gn.view(x.sizes()), scale), reduce_like(grad_normed, shift),
          weight ? reduce_like(r.dw.view(x.sizes()), *weight) : none_grad(x)};
}

// Meta: the gradients' shapes and dtypes.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> adaln_rms_norm_backward_meta(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
    const OptTensor& weight, double eps) {
  check_adaln_rms_norm_backward(grad_out, x, scale, shift, weight, eps);
  return {meta_grad(x), meta_grad(scale), meta_grad(shift), weight ? meta_grad(*weight) : none_grad(x)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
gated_residual_adaln_rms_norm_backward_meta(const at::Tensor& grad_x_new, const at::Tensor& grad_normed,
                                            const at::Tensor& x, const at::Tensor& y, const OptTensor& gate,
                                            const at::Tensor& scale, const at::Tensor& shift,
                                            const OptTensor& weight, double eps) {
  check_gated_residual_adaln_rms_norm_backward(grad_x_new, grad_normed, x, y, gate, scale, shift, weight, eps);
  return {meta_grad(x), meta_grad(y), gate ? meta_grad(*gate) : none_grad(x), meta_grad(scale), meta_grad(shift),
          weight ? meta_grad(*weight) : none_grad(x)};
}

#ifdef LTX_KERNELS_WITH_CUDA
// The fused kernel's gradients of a norm: dx (with fused_add_rms_norm's grad_new_residual
// added), dw and dbias from per-block fp32 partial sums, each rounded once.
struct FusedGrads {
  at::Tensor dx, dweight, dbias;
};

// The kernel's params for these arguments (no pointers yet), or nullopt when the kernel does
// not take them: grad_out in another dtype (a float32 out of a 16-bit x).
std::optional<NormBackwardParams> fused_form(NormType type, const at::Tensor& grad_out, const at::Tensor& x,
                                             double eps, double weight_offset) {
  if (grad_out.scalar_type() != x.scalar_type() || grad_out.sizes() != x.sizes() || x.dim() == 0) return std::nullopt;
  NormBackwardParams p;
  p.type = type;
  p.dtype = to_dtype(x.scalar_type());
  p.cols = x.size(-1);
  p.rows = p.cols == 0 ? 0 : x.numel() / p.cols;
  p.eps = static_cast<float>(eps);
  p.weight_offset = static_cast<float>(weight_offset);
  return p;
}

// The gradients from the fused kernel, or nullopt when the rows do not fit it (the vector width,
// and so the row length it holds in registers, depends on the pointers and strides).
std::optional<FusedGrads> fused_norm_backward(NormBackwardParams p, const char* op, const at::Tensor& grad_out,
                                              const at::Tensor& x, const at::Tensor* grad_new_residual,
                                              const OptTensor& weight, const OptTensor& bias) {
  FusedGrads g;
  g.dx = at::empty(x.sizes(), x.options());
  g.dweight = none_grad(x);
  g.dbias = none_grad(x);
  if (p.rows == 0 || p.cols == 0) {  // no rows: zero weight and bias gradients
    if (weight) g.dweight = at::zeros(weight->sizes(), weight->options());
    if (bias) g.dbias = at::zeros(bias->sizes(), bias->options());
    return g;
  }
  const Rows x_rows = as_rows(x), dy_rows = as_rows(last_dim_contiguous(grad_out));
  p.x = x_rows.tensor.const_data_ptr();
  p.x_row_stride = x_rows.row_stride;
  p.grad_out = dy_rows.tensor.const_data_ptr();
  p.grad_out_row_stride = dy_rows.row_stride;
  Rows gnr_rows;
  if (grad_new_residual) {
    gnr_rows = as_rows(last_dim_contiguous(*grad_new_residual));
    p.grad_new_residual = gnr_rows.tensor.const_data_ptr();
    p.grad_new_residual_row_stride = gnr_rows.row_stride;
  }
  p.out = g.dx.mutable_data_ptr();
  p.out_row_stride = p.cols;
  // The forward's checks made weight and bias [D] vectors in x's dtype or float32 (one dtype
  // both, as the forward reads them); contiguous copies only where a view is strided.
  const at::Tensor w = weight ? weight->contiguous() : at::Tensor();
  if (weight) {
    p.weight = w.const_data_ptr();
    p.weight_dtype = to_dtype(w.scalar_type());
  } else if (bias) {
    p.weight_dtype = to_dtype(bias->scalar_type());
  }
  if (weight && bias && bias->scalar_type() != weight->scalar_type()) return std::nullopt;
  if (!norm_backward_supported(p)) return std::nullopt;
  // Two blocks an SM, each summing its rows' dw / dbias in fp32; their partial rows summed once.
  const int64_t sms = at::cuda::getDeviceProperties(x.device().index())->multiProcessorCount;
  p.blocks = std::max<int64_t>(1, std::min(p.rows, 2 * sms));
  at::Tensor dw_partial, db_partial;
  if (weight) {
    dw_partial = at::empty({p.blocks, p.cols}, x.options().dtype(at::kFloat));
    p.dweight_partial = dw_partial.mutable_data_ptr<float>();
    g.dweight = at::empty(weight->sizes(), weight->options());
    p.dweight = g.dweight.mutable_data_ptr();
  }
  if (bias) {
    db_partial = at::empty({p.blocks, p.cols}, x.options().dtype(at::kFloat));
    p.dbias_partial = db_partial.mutable_data_ptr<float>();
    g.dbias = at::empty(bias->sizes(), bias->options());
    p.dbias = g.dbias.mutable_data_ptr();
  }
  check_core(p, op);
  run_cuda(p, x, op);
  return g;
}

Grads2 rms_norm_backward_cuda(const at::Tensor& grad_out, const at::Tensor& x, const OptTensor& weight, double eps,
                              double weight_offset, std::optional<at::ScalarType> out_dtype) {
  check_rms_norm_backward(grad_out, x, weight, eps, out_dtype);
  const auto p = fused_form(NormType::kRms, grad_out, x, eps, weight_offset);
  const auto g = p ? fused_norm_backward(*p, "rms_norm_backward", grad_out, x, nullptr, weight, std::nullopt)
                   : std::nullopt;
  if (!g) return rms_norm_backward(grad_out, x, weight, eps, weight_offset, out_dtype);
  return {g->dx, g->dweight};
}

Grads3 layer_norm_backward_cuda(const at::Tensor& grad_out, const at::Tensor& x, const OptTensor& weight,
                                const OptTensor& bias, double eps) {
  check_layer_norm_backward(grad_out, x, weight, bias, eps);
  const auto p = fused_form(NormType::kLayer, grad_out, x, eps, 0.0);
  const auto g = p ? fused_norm_backward(*p, "layer_norm_backward", grad_out, x, nullptr, weight, bias)
                   : std::nullopt;
  if (!g) return layer_norm_backward(grad_out, x, weight, bias, eps);
  return {g->dx, g->dweight, g->dbias};
}

Grads2 fused_add_rms_norm_backward_cuda(const at::Tensor& grad_out, const at::Tensor& grad_new_residual,
                                        const OptTensor& x, const OptTensor& residual, const OptTensor& weight,
                                        double eps, double weight_offset, const at::Tensor& new_residual) {
  check_fused_add_rms_norm_backward(grad_out, grad_new_residual, x, residual, weight, eps, new_residual);
  const at::Tensor& h = new_residual;  // the kernel's x: the rows the forward normalized
  const bool same_form = grad_new_residual.scalar_type() == h.scalar_type() && grad_new_residual.sizes() == h.sizes();
  const auto p = same_form ? fused_form(NormType::kRms, grad_out, h, eps, weight_offset) : std::nullopt;
  const auto g = p ? fused_norm_backward(*p, "fused_add_rms_norm_backward", grad_out, h, &grad_new_residual, weight,
                                         std::nullopt)
                   : std::nullopt;
  if (!g) {
    return fused_add_rms_norm_backward(grad_out, grad_new_residual, x, residual, weight, eps, weight_offset, h);
  }
  return {g->dx, g->dweight};
}
#endif

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  LTX_KERNELS_IMPL(m, "rms_norm_backward", rms_norm_backward);
  LTX_KERNELS_IMPL(m, "layer_norm_backward", layer_norm_backward);
  LTX_KERNELS_IMPL(m, "fused_add_rms_norm_backward", fused_add_rms_norm_backward);
  LTX_KERNELS_IMPL(m, "adaln_layer_norm_backward", adaln_layer_norm_backward);
}

LTX_KERNELS_LIBRARY_IMPL(CPU, m) {
  LTX_KERNELS_IMPL(m, "adaln_rms_norm_backward", adaln_rms_norm_backward);
  LTX_KERNELS_IMPL(m, "gated_residual_adaln_rms_norm_backward", gated_residual_adaln_rms_norm_backward);
}

LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  LTX_KERNELS_IMPL(m, "adaln_rms_norm_backward", adaln_rms_norm_backward_meta);
  LTX_KERNELS_IMPL(m, "gated_residual_adaln_rms_norm_backward", gated_residual_adaln_rms_norm_backward_meta);
}

#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) {
  LTX_KERNELS_IMPL(m, "rms_norm_backward", rms_norm_backward_cuda);
  LTX_KERNELS_IMPL(m, "layer_norm_backward", layer_norm_backward_cuda);
  LTX_KERNELS_IMPL(m, "fused_add_rms_norm_backward", fused_add_rms_norm_backward_cuda);
  LTX_KERNELS_IMPL(m, "adaln_rms_norm_backward", adaln_rms_norm_backward);
  LTX_KERNELS_IMPL(m, "gated_residual_adaln_rms_norm_backward", gated_residual_adaln_rms_norm_backward);
}
#endif

}  // namespace ltx_kernels::torch_ext

// torch bindings of the norm family: rms_norm, fused_add_rms_norm(_), layer_norm.
#include <torch/library.h>

#include "ltx_kernels/norm.h"
#include "torch/common.h"

namespace ltx_kernels::torch_ext {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Checks shared by the real and the Meta implementations; returns weight and bias contiguous.
std::pair<OptTensor, OptTensor> check_norm_args(const char* op, const at::Tensor& x,
                                                const at::Tensor* residual, const OptTensor& weight,
                                                const OptTensor& bias, double eps) {
  check_activation(x, "x");
  if (residual) check_like(*residual, "residual", x, "x");
  // std::to_string, not the stream operator: see the note on formatting in common.cpp.
  TORCH_CHECK_VALUE(eps >= 0.0, op, ": eps must be >= 0, got ", std::to_string(eps));
  return {channel_vector(weight, "weight", x, "x"), channel_vector(bias, "bias", x, "x")};
}

NormParams make_params(NormType type, const Rows& x, const OptTensor& weight,
                       const OptTensor& bias, double eps, double weight_offset, at::Tensor& out) {
  NormParams p;
  p.type = type;
  p.dtype = to_dtype(x.tensor.scalar_type());
  p.rows = x.rows;
  p.cols = x.cols;
  p.eps = static_cast<float>(eps);
  p.x = x.tensor.const_data_ptr();
  p.x_row_stride = x.row_stride;
  p.weight = data_or_null(weight);
  p.weight_offset = static_cast<float>(weight_offset);
  p.bias = data_or_null(bias);
  p.out = out.mutable_data_ptr();
  p.out_row_stride = x.cols;
  return p;
}

at::Tensor rms_norm(const at::Tensor& x, const OptTensor& weight, double eps,
                    double weight_offset) {
  const auto [w, b] = check_norm_args("rms_norm", x, nullptr, weight, std::nullopt, eps);
  const Rows rows = as_rows(x);
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (rows.rows == 0) return out;
  run(make_params(NormType::kRms, rows, w, b, eps, weight_offset, out), x, "rms_norm");
  return out;
}

at::Tensor layer_norm(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                      double eps) {
  const auto [w, b] = check_norm_args("layer_norm", x, nullptr, weight, bias, eps);
  const Rows rows = as_rows(x);
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (rows.rows == 0) return out;
  run(make_params(NormType::kLayer, rows, w, b, eps, 0.0, out), x, "layer_norm");
  return out;
}

// Writes rms_norm(x + residual) to the returned tensor and x + residual to residual_out.
at::Tensor add_rms_norm_into(const char* op, const at::Tensor& x, const at::Tensor& residual,
                             at::Tensor& residual_out, const OptTensor& weight, double eps,
                             double weight_offset) {
  const auto [w, b] = check_norm_args(op, x, &residual, weight, std::nullopt, eps);
  const Rows rows = as_rows(x);
  const Rows res = as_rows(residual);
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (rows.rows == 0) return out;
  // residual_out is either fresh (contiguous) or residual itself; a residual that had to be
  // copied to be read as rows is updated through that copy, then copied back.
  const bool in_place = residual_out.is_same(residual);
  at::Tensor res_out = in_place ? res.tensor : residual_out;
  NormParams p = make_params(NormType::kRms, rows, w, b, eps, weight_offset, out);
  p.residual = res.tensor.const_data_ptr();
  p.residual_row_stride = res.row_stride;
  p.residual_out = res_out.mutable_data_ptr();
  p.residual_out_row_stride = in_place ? res.row_stride : rows.cols;
  run(p, x, op);
  if (in_place && !res.tensor.is_same(residual)) residual.copy_(res.tensor);
  return out;
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const OptTensor& weight, double eps,
                                                      double weight_offset) {
  at::Tensor residual_out = at::empty(x.sizes(), x.options());
  at::Tensor out = add_rms_norm_into("fused_add_rms_norm", x, residual, residual_out, weight,
                                     eps, weight_offset);
  return {out, residual_out};
}

at::Tensor fused_add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const OptTensor& weight,
                               double eps, double weight_offset) {
  return add_rms_norm_into("fused_add_rms_norm_", x, residual, residual, weight, eps,
                           weight_offset);
}

// Meta (fake) implementations: same checks, outputs of the right shape, no data.
at::Tensor empty_like_x(const at::Tensor& x) { return at::empty_symint(x.sym_sizes(), x.options()); }

at::Tensor rms_norm_meta(const at::Tensor& x, const OptTensor& weight, double eps, double) {
  check_norm_args("rms_norm", x, nullptr, weight, std::nullopt, eps);
  return empty_like_x(x);
}

at::Tensor layer_norm_meta(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                           double eps) {
  check_norm_args("layer_norm", x, nullptr, weight, bias, eps);
  return empty_like_x(x);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_meta(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           const OptTensor& weight, double eps,
                                                           double) {
  check_norm_args("fused_add_rms_norm", x, &residual, weight, std::nullopt, eps);
  return {empty_like_x(x), empty_like_x(x)};
}

at::Tensor fused_add_rms_norm__meta(const at::Tensor& x, at::Tensor& residual,
                                    const OptTensor& weight, double eps, double) {
  check_norm_args("fused_add_rms_norm_", x, &residual, weight, std::nullopt, eps);
  return empty_like_x(x);
}

}  // namespace

TORCH_LIBRARY_IMPL(ltx_kernels, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("fused_add_rms_norm_", &fused_add_rms_norm_);
  m.impl("layer_norm", &layer_norm);
}

#ifdef LTX_KERNELS_WITH_CUDA
TORCH_LIBRARY_IMPL(ltx_kernels, CUDA, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("fused_add_rms_norm_", &fused_add_rms_norm_);
  m.impl("layer_norm", &layer_norm);
}
#endif

TORCH_LIBRARY_IMPL(ltx_kernels, Meta, m) {
  m.impl("rms_norm", &rms_norm_meta);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm_meta);
  m.impl("fused_add_rms_norm_", &fused_add_rms_norm__meta);
  m.impl("layer_norm", &layer_norm_meta);
}

}  // namespace ltx_kernels::torch_ext

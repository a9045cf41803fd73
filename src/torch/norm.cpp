// torch bindings of the norm family: rms_norm, fused_add_rms_norm(_), layer_norm, and the
// DiT forms adaln_rms_norm, adaln_layer_norm, gated_residual_adaln_rms_norm; the RMS forms and
// adaln_layer_norm also with an FP8 output (*_fp8: the norm feeding an FP8 GEMM, quantized in
// the same pass).
#include "torch/registration.h"

#include "ltx_kernels/norm.h"
#include "torch/common.h"
#include "torch/op_checks.h"

namespace ltx_kernels::torch_ext {
namespace {

bool is_float32(const OptTensor& t) { return t && t->scalar_type() == at::kFloat; }

}  // namespace

std::pair<OptTensor, OptTensor> check_norm_args(const char* op, const at::Tensor& x,
                                                const at::Tensor* residual, const OptTensor& weight,
                                                const OptTensor& bias, double eps, Params params,
                                                at::ScalarType out_dtype) {
  check_activation(x, "x");
  if (residual) check_like(*residual, "residual", x, "x");
  // std::to_string, not the stream operator: see the note on formatting in common.cpp.
  TORCH_CHECK_VALUE(eps >= 0.0, op, ": eps must be >= 0, got ", std::to_string(eps));
  const bool or_float32 = params == Params::kLikeXOrFloat32;
  OptTensor w = channel_vector(weight, "weight", x, "x", or_float32);
  OptTensor b = channel_vector(bias, "bias", x, "x", or_float32);
  if (is_float32(w) || is_float32(b) || out_dtype == at::kFloat) {
    if (w) w = w->to(at::kFloat);
    if (b) b = b->to(at::kFloat);
  }
  return {w, b};
}

at::ScalarType norm_out_dtype(const char* op, const at::Tensor& x, std::optional<at::ScalarType> requested) {
  const at::ScalarType out_dtype = requested.value_or(x.scalar_type());
  TORCH_CHECK_TYPE(out_dtype == x.scalar_type() || out_dtype == at::kFloat, op,
                   ": out_dtype must be the dtype of x (", x.scalar_type(), ") or float32, got ", out_dtype);
  return out_dtype;
}

void check_modulation(const at::Tensor& x, const at::Tensor* scale, const at::Tensor* shift) {
  if (!scale) return;
  check_row_vectors(*scale, "scale", x);
  check_row_vectors(*shift, "shift", x);
}

namespace {

// `out` may be null when the params get an FP8 output instead (set_fp8_out).
NormParams make_params(NormType type, const Rows& x, const OptTensor& weight,
                       const OptTensor& bias, double eps, double weight_offset, at::Tensor* out) {
  NormParams p;
  p.type = type;
  p.dtype = to_dtype(x.tensor.scalar_type());
  // Weight and bias come in one dtype (check_norm_args), float32 with a float32 out.
  p.out_dtype = out ? to_dtype(out->scalar_type()) : p.dtype;
  p.weight_dtype = is_float32(weight) || is_float32(bias) ? DType::kFloat32 : p.out_dtype;
  p.rows = x.rows;
  p.cols = x.cols;
  p.eps = static_cast<float>(eps);
  p.x = x.tensor.const_data_ptr();
  p.x_row_stride = x.row_stride;
  p.weight = data_or_null(weight);
  p.weight_offset = static_cast<float>(weight_offset);
  p.bias = data_or_null(bias);
  p.out = out ? out->mutable_data_ptr() : nullptr;
  p.out_row_stride = out ? x.cols : 0;
  return p;
}

// The FP8 form of a norm's output (quantize.h): e4m3 values of x's shape and one fp32 scale
// per row, exactly quantize_fp8 of the dtype output (which is not written).
struct Fp8Out {
  at::Tensor q;
  at::Tensor scale;
};

Fp8Out empty_fp8(const at::Tensor& x) {
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(at::kFloat8_e4m3fn)),
          at::empty_symint(c10::SymIntArrayRef(x.sym_sizes().data(), x.dim() - 1), x.options().dtype(at::kFloat))};
}

void set_fp8_out(NormParams& p, Fp8Out& o) {
  p.out_fp8 = static_cast<uint8_t*>(o.q.mutable_data_ptr());
  p.out_fp8_row_stride = p.cols;
  p.out_fp8_scale = o.scale.mutable_data_ptr<float>();
}

// AdaLN modulation: out = norm(x) * (1 + scale) + shift. Sets `p`'s scale and shift and
// keeps the tensors they point into alive in `keep`.
void set_modulation(NormParams& p, const at::Tensor& x, const at::Tensor& scale,
                    const at::Tensor& shift, at::Tensor (&keep)[3]) {
  p.tokens = p.rows / batches_of(x);
  p.scale = row_vectors(scale, x, keep[0]);
  p.shift = row_vectors(shift, x, keep[1]);
}

// One normalization of x into `out` or, with `fp8`, quantized into it; modulated when scale
// (and shift) are given: rms_norm, layer_norm, adaln_rms_norm, adaln_layer_norm and the FP8
// forms.
void normalize_into(const char* op, NormType type, const at::Tensor& x, const OptTensor& weight,
                    const OptTensor& bias, double eps, double weight_offset, const at::Tensor* scale,
                    const at::Tensor* shift, at::Tensor* out, Fp8Out* fp8, Params params = Params::kLikeX) {
  const auto [w, b] = check_norm_args(op, x, nullptr, weight, bias, eps, params,
                                      out ? out->scalar_type() : at::ScalarType::Undefined);
  check_modulation(x, scale, shift);
  // Rows walked in memory order where out has x's strides (empty_norm_out): a permuted view is
  // normalized where it lies. The modulated forms read a scale row per batch, found from the
  // row's logical index, so they keep the logical order.
  const bool memory_order = !scale && out && out->strides() == x.strides() && rows_dense_in_memory(x);
  const Rows rows = memory_order ? memory_order_rows(x) : as_rows(x);
  if (rows.rows == 0) return;
  NormParams p = make_params(type, rows, w, b, eps, weight_offset, out);
  if (fp8) set_fp8_out(p, *fp8);
  at::Tensor keep[3];
  if (scale) set_modulation(p, x, *scale, *shift, keep);
  run(p, x, op);
}

// A norm's fresh output: with x's strides where x's rows are dense in memory and the norm is
// not modulated (normalize_into then walks the rows in memory order: diffusers' q/k norms of
// q.transpose(1, 2) read and write in place of a copy first), else contiguous. The CUDA, CPU
// and Meta implementations all lay it out so.
at::Tensor empty_norm_out(const at::Tensor& x, at::ScalarType dtype, bool modulated) {
  const auto options = x.options().dtype(dtype);
  return !modulated && rows_dense_in_memory(x) ? at::empty_strided_symint(x.sym_sizes(), x.sym_strides(), options)
                                               : at::empty_symint(x.sym_sizes(), options);
}

// A fresh tensor holding x normalized (normalize_into with a new out of x's dtype, or of
// out_dtype where the op has one).
at::Tensor normalized(const char* op, NormType type, const at::Tensor& x, const OptTensor& weight,
                      const OptTensor& bias, double eps, double weight_offset,
                      const at::Tensor* scale = nullptr, const at::Tensor* shift = nullptr,
                      Params params = Params::kLikeX, std::optional<at::ScalarType> out_dtype = std::nullopt) {
  at::Tensor out = empty_norm_out(x, norm_out_dtype(op, x, out_dtype), scale != nullptr);
  normalize_into(op, type, x, weight, bias, eps, weight_offset, scale, shift, &out, nullptr, params);
  return out;
}

std::tuple<at::Tensor, at::Tensor> normalize_fp8(const char* op, NormType type, const at::Tensor& x,
                                                 const OptTensor& weight, const OptTensor& bias, double eps,
                                                 double weight_offset, const at::Tensor* scale = nullptr,
                                                 const at::Tensor* shift = nullptr) {
  Fp8Out o = empty_fp8(x);
  normalize_into(op, type, x, weight, bias, eps, weight_offset, scale, shift, nullptr, &o);
  return {o.q, o.scale};
}

at::Tensor rms_norm(const at::Tensor& x, const OptTensor& weight, double eps, double weight_offset,
                    std::optional<at::ScalarType> out_dtype) {
  return normalized("rms_norm", NormType::kRms, x, weight, std::nullopt, eps, weight_offset, nullptr, nullptr,
                    Params::kLikeXOrFloat32, out_dtype);
}

at::Tensor layer_norm(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                      double eps) {
  return normalized("layer_norm", NormType::kLayer, x, weight, bias, eps, 0.0, nullptr, nullptr,
                    Params::kLikeXOrFloat32);
}

at::Tensor adaln_rms_norm(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                          const OptTensor& weight, double eps) {
  return normalized("adaln_rms_norm", NormType::kRms, x, weight, std::nullopt, eps, 0.0, &scale,
                    &shift);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fp8(const at::Tensor& x, const OptTensor& weight, double eps,
                                                double weight_offset) {
  return normalize_fp8("rms_norm_fp8", NormType::kRms, x, weight, std::nullopt, eps, weight_offset);
}

std::tuple<at::Tensor, at::Tensor> adaln_rms_norm_fp8(const at::Tensor& x, const at::Tensor& scale,
                                                      const at::Tensor& shift, const OptTensor& weight, double eps) {
  return normalize_fp8("adaln_rms_norm_fp8", NormType::kRms, x, weight, std::nullopt, eps, 0.0, &scale, &shift);
}

std::tuple<at::Tensor, at::Tensor> adaln_layer_norm_fp8(const at::Tensor& x, const at::Tensor& scale,
                                                        const at::Tensor& shift, const OptTensor& weight,
                                                        const OptTensor& bias, double eps) {
  return normalize_fp8("adaln_layer_norm_fp8", NormType::kLayer, x, weight, bias, eps, 0.0, &scale, &shift);
}

at::Tensor adaln_layer_norm(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                            const OptTensor& weight, const OptTensor& bias, double eps) {
  return normalized("adaln_layer_norm", NormType::kLayer, x, weight, bias, eps, 0.0, &scale,
                    &shift);
}

// The out= forms: `out` has x's dtype, device and shape and is contiguous (the kernels write
// rows of cols elements back to back), and overlaps nothing the op reads.
void check_norm_out(const char* op, const at::Tensor& out, const at::Tensor& x,
                    std::initializer_list<std::pair<const at::Tensor*, const char*>> read) {
  TORCH_CHECK_TYPE(out.scalar_type() == x.scalar_type(), op, ": out must have the dtype of x (",
                   x.scalar_type(), "), got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.device() == x.device(), op, ": out must be on the device of x (", device_str(x.device()),
                    "), got ", device_str(out.device()));
  TORCH_CHECK_VALUE(out.sym_sizes() == x.sym_sizes(), op, ": out must have the shape of x ",
                    dims_str(x.sym_sizes()), ", got ", dims_str(out.sym_sizes()));
  TORCH_CHECK_VALUE(out.is_contiguous(), op, ": out must be contiguous");
  for (const auto& [t, name] : read) {
    if (t != nullptr) check_written(op, out, "out", *t, name);
  }
}

void adaln_rms_norm_out(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                        const OptTensor& weight, double eps, at::Tensor& out) {
  check_norm_out("adaln_rms_norm", out, x,
                 {{&x, "x"}, {&scale, "scale"}, {&shift, "shift"}, {weight ? &*weight : nullptr, "weight"}});
  normalize_into("adaln_rms_norm", NormType::kRms, x, weight, std::nullopt, eps, 0.0, &scale, &shift, &out,
                 nullptr);
}

void adaln_layer_norm_out(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                          const OptTensor& weight, const OptTensor& bias, double eps, at::Tensor& out) {
  check_norm_out("adaln_layer_norm", out, x,
                 {{&x, "x"}, {&scale, "scale"}, {&shift, "shift"}, {weight ? &*weight : nullptr, "weight"},
                  {bias ? &*bias : nullptr, "bias"}});
  normalize_into("adaln_layer_norm", NormType::kLayer, x, weight, bias, eps, 0.0, &scale, &shift, &out, nullptr);
}

// Writes rms_norm(x + residual) to `out` (or, with `fp8`, quantized to it) and x + residual
// to new_residual.
void add_rms_norm_into(const char* op, const at::Tensor& x, const at::Tensor& residual, at::Tensor& new_residual,
                       const OptTensor& weight, double eps, double weight_offset, at::Tensor* out, Fp8Out* fp8) {
  // (an FP8 output comes with weights in x's dtype only: validate)
  const auto [w, b] = check_norm_args(op, x, &residual, weight, std::nullopt, eps,
                                      fp8 ? Params::kLikeX : Params::kLikeXOrFloat32);
  const Rows rows = as_rows(x);
  const Rows res = as_rows(residual);
  if (rows.rows == 0) return;
  // new_residual is either fresh (contiguous) or residual itself; a residual that had to be
  // copied to be read as rows is updated through that copy, then copied back.
  const bool in_place = new_residual.is_same(residual);
  at::Tensor res_out = in_place ? res.tensor : new_residual;
  NormParams p = make_params(NormType::kRms, rows, w, b, eps, weight_offset, out);
  if (fp8) set_fp8_out(p, *fp8);
  p.residual = res.tensor.const_data_ptr();
  p.residual_row_stride = res.row_stride;
  p.new_residual = res_out.mutable_data_ptr();
  p.new_residual_row_stride = in_place ? res.row_stride : rows.cols;
  run(p, x, op);
  if (in_place && !res.tensor.is_same(residual)) residual.copy_(res.tensor);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const OptTensor& weight, double eps,
                                                      double weight_offset) {
  at::Tensor new_residual = at::empty(x.sizes(), x.options());
  at::Tensor out = at::empty(x.sizes(), x.options());
  add_rms_norm_into("fused_add_rms_norm", x, residual, new_residual, weight, eps, weight_offset, &out, nullptr);
  return {out, new_residual};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_fp8(const at::Tensor& x, const at::Tensor& residual,
                                                                      const OptTensor& weight, double eps,
                                                                      double weight_offset) {
  at::Tensor new_residual = at::empty(x.sizes(), x.options());
  Fp8Out o = empty_fp8(x);
  add_rms_norm_into("fused_add_rms_norm_fp8", x, residual, new_residual, weight, eps, weight_offset, nullptr, &o);
  return {o.q, o.scale, new_residual};
}

at::Tensor fused_add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const OptTensor& weight,
                               double eps, double weight_offset) {
  check_written("fused_add_rms_norm_", residual, "residual", x, "x");
  at::Tensor out = at::empty(x.sizes(), x.options());
  add_rms_norm_into("fused_add_rms_norm_", x, residual, residual, weight, eps, weight_offset, &out, nullptr);
  return out;
}

// x_new = x + y * gate; normed = rms_norm(x_new) * (1 + scale) + shift, written as dtype to
// `normed` or, with `fp8`, quantized to it.
void gated_residual_adaln_rms_norm_into(const char* op, const at::Tensor& x, const at::Tensor& y,
                                        const OptTensor& gate, const at::Tensor& scale, const at::Tensor& shift,
                                        const OptTensor& weight, double eps, at::Tensor& x_new, at::Tensor* normed,
                                        Fp8Out* fp8) {
  const auto [w, b] = check_norm_args(op, x, nullptr, weight, std::nullopt, eps);
  check_activation(y, "y");
  check_like(y, "y", x, "x");
  if (gate) check_row_vectors(*gate, "gate", x);
  check_modulation(x, &scale, &shift);
  const Rows x_rows = as_rows(x);
  const Rows y_rows = as_rows(y);
  if (x_rows.rows == 0) return;
  // In NormParams terms the branch output y is the input and x the residual stream.
  NormParams p = make_params(NormType::kRms, y_rows, w, b, eps, 0.0, normed);
  if (fp8) set_fp8_out(p, *fp8);
  p.residual = x_rows.tensor.const_data_ptr();
  p.residual_row_stride = x_rows.row_stride;
  p.new_residual = x_new.mutable_data_ptr();
  p.new_residual_row_stride = x_rows.cols;
  at::Tensor keep[3];
  set_modulation(p, x, scale, shift, keep);
  if (gate) p.gate = row_vectors(*gate, x, keep[2]);
  run(p, x, op);
}

std::tuple<at::Tensor, at::Tensor> gated_residual_adaln_rms_norm(
    const at::Tensor& x, const at::Tensor& y, const OptTensor& gate, const at::Tensor& scale,
    const at::Tensor& shift, const OptTensor& weight, double eps) {
  at::Tensor x_new = at::empty(x.sizes(), x.options());
  at::Tensor normed = at::empty(x.sizes(), x.options());
  gated_residual_adaln_rms_norm_into("gated_residual_adaln_rms_norm", x, y, gate, scale, shift, weight, eps, x_new,
                                     &normed, nullptr);
  return {x_new, normed};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_residual_adaln_rms_norm_fp8(
    const at::Tensor& x, const at::Tensor& y, const OptTensor& gate, const at::Tensor& scale,
    const at::Tensor& shift, const OptTensor& weight, double eps) {
  at::Tensor x_new = at::empty(x.sizes(), x.options());
  Fp8Out o = empty_fp8(x);
  gated_residual_adaln_rms_norm_into("gated_residual_adaln_rms_norm_fp8", x, y, gate, scale, shift, weight, eps,
                                     x_new, nullptr, &o);
  return {x_new, o.q, o.scale};
}

// Meta (fake) implementations: same checks, outputs of the right shape, no data.
at::Tensor empty_like_x(const at::Tensor& x) { return at::empty_symint(x.sym_sizes(), x.options()); }

at::Tensor normalize_meta(const char* op, const at::Tensor& x, const OptTensor& weight,
                          const OptTensor& bias, double eps, const at::Tensor* scale = nullptr,
                          const at::Tensor* shift = nullptr) {
  check_norm_args(op, x, nullptr, weight, bias, eps);
  check_modulation(x, scale, shift);
  return empty_like_x(x);
}

at::Tensor rms_norm_meta(const at::Tensor& x, const OptTensor& weight, double eps, double,
                         std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = norm_out_dtype("rms_norm", x, out_dtype);
  check_norm_args("rms_norm", x, nullptr, weight, std::nullopt, eps, Params::kLikeXOrFloat32, dtype);
  return empty_norm_out(x, dtype, false);
}

at::Tensor layer_norm_meta(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                           double eps) {
  check_norm_args("layer_norm", x, nullptr, weight, bias, eps, Params::kLikeXOrFloat32);
  return empty_norm_out(x, x.scalar_type(), false);
}

at::Tensor adaln_rms_norm_meta(const at::Tensor& x, const at::Tensor& scale,
                               const at::Tensor& shift, const OptTensor& weight, double eps) {
  return normalize_meta("adaln_rms_norm", x, weight, std::nullopt, eps, &scale, &shift);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fp8_meta(const at::Tensor& x, const OptTensor& weight, double eps,
                                                     double) {
  normalize_meta("rms_norm_fp8", x, weight, std::nullopt, eps);
  Fp8Out o = empty_fp8(x);
  return {o.q, o.scale};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_fp8_meta(const at::Tensor& x,
                                                                           const at::Tensor& residual,
                                                                           const OptTensor& weight, double eps,
                                                                           double) {
  check_norm_args("fused_add_rms_norm_fp8", x, &residual, weight, std::nullopt, eps);
  Fp8Out o = empty_fp8(x);
  return {o.q, o.scale, empty_like_x(x)};
}

std::tuple<at::Tensor, at::Tensor> adaln_rms_norm_fp8_meta(const at::Tensor& x, const at::Tensor& scale,
                                                           const at::Tensor& shift, const OptTensor& weight,
                                                           double eps) {
  normalize_meta("adaln_rms_norm_fp8", x, weight, std::nullopt, eps, &scale, &shift);
  Fp8Out o = empty_fp8(x);
  return {o.q, o.scale};
}

at::Tensor adaln_layer_norm_meta(const at::Tensor& x, const at::Tensor& scale,
                                 const at::Tensor& shift, const OptTensor& weight,
                                 const OptTensor& bias, double eps) {
  return normalize_meta("adaln_layer_norm", x, weight, bias, eps, &scale, &shift);
}

std::tuple<at::Tensor, at::Tensor> adaln_layer_norm_fp8_meta(const at::Tensor& x, const at::Tensor& scale,
                                                             const at::Tensor& shift, const OptTensor& weight,
                                                             const OptTensor& bias, double eps) {
  normalize_meta("adaln_layer_norm_fp8", x, weight, bias, eps, &scale, &shift);
  Fp8Out o = empty_fp8(x);
  return {o.q, o.scale};
}

void adaln_rms_norm_out_meta(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                             const OptTensor& weight, double eps, at::Tensor& out) {
  normalize_meta("adaln_rms_norm", x, weight, std::nullopt, eps, &scale, &shift);
  check_norm_out("adaln_rms_norm", out, x, {});
}

void adaln_layer_norm_out_meta(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                               const OptTensor& weight, const OptTensor& bias, double eps, at::Tensor& out) {
  normalize_meta("adaln_layer_norm", x, weight, bias, eps, &scale, &shift);
  check_norm_out("adaln_layer_norm", out, x, {});
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_meta(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           const OptTensor& weight, double eps,
                                                           double) {
  check_norm_args("fused_add_rms_norm", x, &residual, weight, std::nullopt, eps, Params::kLikeXOrFloat32);
  return {empty_like_x(x), empty_like_x(x)};
}

at::Tensor fused_add_rms_norm__meta(const at::Tensor& x, at::Tensor& residual,
                                    const OptTensor& weight, double eps, double) {
  check_norm_args("fused_add_rms_norm_", x, &residual, weight, std::nullopt, eps, Params::kLikeXOrFloat32);
  return empty_like_x(x);
}

void check_gated_residual_adaln(const char* op, const at::Tensor& x, const at::Tensor& y, const OptTensor& gate,
                                const at::Tensor& scale, const at::Tensor& shift, const OptTensor& weight,
                                double eps) {
  check_norm_args(op, x, nullptr, weight, std::nullopt, eps);
  check_activation(y, "y");
  check_like(y, "y", x, "x");
  if (gate) check_row_vectors(*gate, "gate", x);
  check_modulation(x, &scale, &shift);
}

std::tuple<at::Tensor, at::Tensor> gated_residual_adaln_rms_norm_meta(
    const at::Tensor& x, const at::Tensor& y, const OptTensor& gate, const at::Tensor& scale,
    const at::Tensor& shift, const OptTensor& weight, double eps) {
  check_gated_residual_adaln("gated_residual_adaln_rms_norm", x, y, gate, scale, shift, weight, eps);
  return {empty_like_x(x), empty_like_x(x)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_residual_adaln_rms_norm_fp8_meta(
    const at::Tensor& x, const at::Tensor& y, const OptTensor& gate, const at::Tensor& scale,
    const at::Tensor& shift, const OptTensor& weight, double eps) {
  check_gated_residual_adaln("gated_residual_adaln_rms_norm_fp8", x, y, gate, scale, shift, weight, eps);
  Fp8Out o = empty_fp8(x);
  return {empty_like_x(x), o.q, o.scale};
}

// CPU and CUDA share the implementations: `run` picks the reference or the launcher.
void register_impls(torch::Library& m) {
  LTX_KERNELS_IMPL(m, "rms_norm", rms_norm);
  LTX_KERNELS_IMPL(m, "fused_add_rms_norm", fused_add_rms_norm);
  LTX_KERNELS_IMPL(m, "fused_add_rms_norm_", fused_add_rms_norm_);
  LTX_KERNELS_IMPL(m, "layer_norm", layer_norm);
  LTX_KERNELS_IMPL(m, "adaln_rms_norm", adaln_rms_norm);
  LTX_KERNELS_IMPL(m, "adaln_layer_norm", adaln_layer_norm);
  LTX_KERNELS_IMPL(m, "adaln_rms_norm.out", adaln_rms_norm_out);
  LTX_KERNELS_IMPL(m, "adaln_layer_norm.out", adaln_layer_norm_out);
  LTX_KERNELS_IMPL(m, "gated_residual_adaln_rms_norm", gated_residual_adaln_rms_norm);
  LTX_KERNELS_IMPL(m, "rms_norm_fp8", rms_norm_fp8);
  LTX_KERNELS_IMPL(m, "fused_add_rms_norm_fp8", fused_add_rms_norm_fp8);
  LTX_KERNELS_IMPL(m, "adaln_rms_norm_fp8", adaln_rms_norm_fp8);
  LTX_KERNELS_IMPL(m, "adaln_layer_norm_fp8", adaln_layer_norm_fp8);
  LTX_KERNELS_IMPL(m, "gated_residual_adaln_rms_norm_fp8", gated_residual_adaln_rms_norm_fp8);
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) { register_impls(m); }

#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) { register_impls(m); }
#endif

LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  LTX_KERNELS_IMPL(m, "rms_norm", rms_norm_meta);
  LTX_KERNELS_IMPL(m, "fused_add_rms_norm", fused_add_rms_norm_meta);
  LTX_KERNELS_IMPL(m, "fused_add_rms_norm_", fused_add_rms_norm__meta);
  LTX_KERNELS_IMPL(m, "layer_norm", layer_norm_meta);
  LTX_KERNELS_IMPL(m, "adaln_rms_norm", adaln_rms_norm_meta);
  LTX_KERNELS_IMPL(m, "adaln_layer_norm", adaln_layer_norm_meta);
  LTX_KERNELS_IMPL(m, "adaln_rms_norm.out", adaln_rms_norm_out_meta);
  LTX_KERNELS_IMPL(m, "adaln_layer_norm.out", adaln_layer_norm_out_meta);
  LTX_KERNELS_IMPL(m, "gated_residual_adaln_rms_norm", gated_residual_adaln_rms_norm_meta);
  LTX_KERNELS_IMPL(m, "rms_norm_fp8", rms_norm_fp8_meta);
  LTX_KERNELS_IMPL(m, "fused_add_rms_norm_fp8", fused_add_rms_norm_fp8_meta);
  LTX_KERNELS_IMPL(m, "adaln_rms_norm_fp8", adaln_rms_norm_fp8_meta);
  LTX_KERNELS_IMPL(m, "adaln_layer_norm_fp8", adaln_layer_norm_fp8_meta);
  LTX_KERNELS_IMPL(m, "gated_residual_adaln_rms_norm_fp8", gated_residual_adaln_rms_norm_fp8_meta);
}

}  // namespace ltx_kernels::torch_ext

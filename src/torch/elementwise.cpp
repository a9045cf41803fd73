// torch bindings of the elementwise family: gelu_tanh, the gated activations (two-input
// *_and_mul forms and the concatenated geglu / swiglu) and gated_residual.
#include "torch/registration.h"

#include "ltx_kernels/elementwise.h"
#include "torch/common.h"

namespace ltx_kernels::torch_ext {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Output shape of a gated activation of a [..., 2H] input: [..., H].
c10::SymDimVector half_shape(const at::Tensor& x) {
  c10::SymDimVector shape(x.sym_sizes().begin(), x.sym_sizes().end());
  shape.back() = shape.back() / 2;
  return shape;
}

void check_concatenated(const at::Tensor& x, const char* op) {
  check_activation(x, "x");
  TORCH_CHECK_VALUE(x.sym_size(-1) % 2 == 0, op, ": the last dim of x must be even ([..., 2H]: ",
                    "act(x[..., :H]) * x[..., H:]), got ", dims_str(x.sym_sizes()));
}

ElementwiseOp gelu_op(c10::string_view approximate) {
  if (approximate == "tanh") return ElementwiseOp::kGeluTanhAndMul;
  TORCH_CHECK_VALUE(approximate == "none", "approximate must be 'tanh' or 'none', got '",
                    std::string(approximate), "'");
  return ElementwiseOp::kGeluAndMul;
}

ElementwiseParams make_params(ElementwiseOp op, const Rows& a, const Rows* b, at::Tensor& out) {
  ElementwiseParams p;
  p.op = op;
  p.dtype = to_dtype(a.tensor.scalar_type());
  p.rows = a.rows;
  p.cols = a.cols;
  p.a = a.tensor.const_data_ptr();
  p.a_row_stride = a.row_stride;
  if (b) {
    p.b = b->tensor.const_data_ptr();
    p.b_row_stride = b->row_stride;
  }
  p.out = out.mutable_data_ptr();
  p.out_row_stride = a.cols;
  return p;
}

// out = op(a, b) for a and b of the same shape (b absent for gelu_tanh); out is contiguous.
void run_into(const char* op_name, ElementwiseOp op, const at::Tensor& a, const at::Tensor* b,
              at::Tensor& out) {
  const Rows a_rows = as_rows(a);
  if (a_rows.rows == 0 || a_rows.cols == 0) return;
  const Rows b_rows = b ? as_rows(*b) : Rows{};
  ElementwiseParams p = make_params(op, a_rows, b ? &b_rows : nullptr, out);
  run(p, a, op_name);
}

at::Tensor gelu_tanh(const at::Tensor& x) {
  check_activation(x, "x");
  at::Tensor out = at::empty(x.sizes(), x.options());
  run_into("gelu_tanh", ElementwiseOp::kGeluTanh, x, nullptr, out);
  return out;
}

at::Tensor and_mul(const char* name, ElementwiseOp op, const at::Tensor& a, const at::Tensor& b) {
  check_activation(a, "a");
  check_like(b, "b", a, "a");
  at::Tensor out = at::empty(a.sizes(), a.options());
  run_into(name, op, a, &b, out);
  return out;
}

at::Tensor gelu_tanh_and_mul(const at::Tensor& a, const at::Tensor& b) {
  return and_mul("gelu_tanh_and_mul", ElementwiseOp::kGeluTanhAndMul, a, b);
}

at::Tensor gelu_and_mul(const at::Tensor& a, const at::Tensor& b) {
  return and_mul("gelu_and_mul", ElementwiseOp::kGeluAndMul, a, b);
}

at::Tensor silu_and_mul(const at::Tensor& a, const at::Tensor& b) {
  return and_mul("silu_and_mul", ElementwiseOp::kSiluAndMul, a, b);
}

void check_out(const at::Tensor& out, const at::Tensor& x) {
  TORCH_CHECK_TYPE(out.scalar_type() == x.scalar_type(), "out must have the dtype of x (",
                   x.scalar_type(), "), got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.device() == x.device(), "out must be on the device of x");
  const c10::SymDimVector shape = half_shape(x);
  TORCH_CHECK_VALUE(out.sym_sizes() == c10::SymIntArrayRef(shape), "out must have shape ",
                    dims_str(shape), " (x's with the last dim halved), got ",
                    dims_str(out.sym_sizes()));
  TORCH_CHECK_VALUE(out.is_contiguous(), "out must be contiguous");
}

// act(x[..., :H]) * x[..., H:] into out; the halves are read in place as strided rows.
void concatenated_into(const char* name, ElementwiseOp op, const at::Tensor& x, at::Tensor& out) {
  check_concatenated(x, name);
  check_out(out, x);
  check_written(name, out, "out", x, "x");
  const int64_t h = x.size(-1) / 2;
  const at::Tensor a = x.narrow(-1, 0, h);
  const at::Tensor b = x.narrow(-1, h, h);
  run_into(name, op, a, &b, out);
}

void geglu_out(const at::Tensor& x, c10::string_view approximate, at::Tensor& out) {
  concatenated_into("geglu", gelu_op(approximate), x, out);
}

at::Tensor geglu(const at::Tensor& x, c10::string_view approximate) {
  check_concatenated(x, "geglu");
  at::Tensor out = at::empty_symint(half_shape(x), x.options());
  geglu_out(x, approximate, out);
  return out;
}

void swiglu_out(const at::Tensor& x, at::Tensor& out) {
  concatenated_into("swiglu", ElementwiseOp::kSiluAndMul, x, out);
}

at::Tensor swiglu(const at::Tensor& x) {
  check_concatenated(x, "swiglu");
  at::Tensor out = at::empty_symint(half_shape(x), x.options());
  swiglu_out(x, out);
  return out;
}

void check_gated_residual(const at::Tensor& x, const at::Tensor& y, const OptTensor& gate) {
  check_activation(x, "x");
  check_like(y, "y", x, "x");
  if (gate) check_row_vectors(*gate, "gate", x);
}

// x + y * gate (gate broadcast over rows like AdaLN's scale; absent = 1).
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& y, const OptTensor& gate) {
  check_gated_residual(x, y, gate);
  at::Tensor out = at::empty(x.sizes(), x.options());
  const Rows x_rows = as_rows(x);
  if (x_rows.rows == 0 || x_rows.cols == 0) return out;
  const Rows y_rows = as_rows(y);
  ElementwiseParams p = make_params(ElementwiseOp::kGatedResidual, x_rows, &y_rows, out);
  at::Tensor keep;
  if (gate) {
    p.tokens = x_rows.rows / batches_of(x);
    p.gate = row_vectors(*gate, x, keep);
  }
  run(p, x, "gated_residual");
  return out;
}

// Meta (fake) implementations: same checks, outputs of the right shape, no data.
at::Tensor like_meta(const at::Tensor& x) { return at::empty_symint(x.sym_sizes(), x.options()); }

at::Tensor gelu_tanh_meta(const at::Tensor& x) {
  check_activation(x, "x");
  return like_meta(x);
}

at::Tensor and_mul_meta(const at::Tensor& a, const at::Tensor& b) {
  check_activation(a, "a");
  check_like(b, "b", a, "a");
  return like_meta(a);
}

at::Tensor geglu_meta(const at::Tensor& x, c10::string_view approximate) {
  check_concatenated(x, "geglu");
  gelu_op(approximate);
  return at::empty_symint(half_shape(x), x.options());
}

void geglu_out_meta(const at::Tensor& x, c10::string_view approximate, at::Tensor& out) {
  check_concatenated(x, "geglu");
  gelu_op(approximate);
  check_out(out, x);
}

at::Tensor swiglu_meta(const at::Tensor& x) {
  check_concatenated(x, "swiglu");
  return at::empty_symint(half_shape(x), x.options());
}

void swiglu_out_meta(const at::Tensor& x, at::Tensor& out) {
  check_concatenated(x, "swiglu");
  check_out(out, x);
}

at::Tensor gated_residual_meta(const at::Tensor& x, const at::Tensor& y, const OptTensor& gate) {
  check_gated_residual(x, y, gate);
  return like_meta(x);
}

void register_impls(torch::Library& m) {
  m.impl("gelu_tanh", &gelu_tanh);
  m.impl("gelu_tanh_and_mul", &gelu_tanh_and_mul);
  m.impl("gelu_and_mul", &gelu_and_mul);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("geglu", &geglu);
  m.impl("geglu.out", &geglu_out);
  m.impl("swiglu", &swiglu);
  m.impl("swiglu.out", &swiglu_out);
  m.impl("gated_residual", &gated_residual);
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) { register_impls(m); }

#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) { register_impls(m); }
#endif

LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  m.impl("gelu_tanh", &gelu_tanh_meta);
  m.impl("gelu_tanh_and_mul", &and_mul_meta);
  m.impl("gelu_and_mul", &and_mul_meta);
  m.impl("silu_and_mul", &and_mul_meta);
  m.impl("geglu", &geglu_meta);
  m.impl("geglu.out", &geglu_out_meta);
  m.impl("swiglu", &swiglu_meta);
  m.impl("swiglu.out", &swiglu_out_meta);
  m.impl("gated_residual", &gated_residual_meta);
}

}  // namespace ltx_kernels::torch_ext

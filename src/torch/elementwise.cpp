// torch bindings of the elementwise family: gelu_tanh, the gated activations (two-input
// *_and_mul forms and the concatenated geglu / swiglu), gated_residual, and the backward ops
// of the activations.
#include "torch/registration.h"

#include "ltx_kernels/elementwise.h"
#include "torch/common.h"
#include "torch/op_checks.h"

namespace ltx_kernels::torch_ext {

void check_gated_residual(const at::Tensor& x, const at::Tensor& y, const OptTensor& gate) {
  check_activation(x, "x");
  check_like(y, "y", x, "x");
  if (gate) check_row_vectors(*gate, "gate", x);
}

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

}  // namespace

at::Tensor gelu_tanh(const at::Tensor& x) {
  check_activation(x, "x");
  at::Tensor out = at::empty(x.sizes(), x.options());
  run_into("gelu_tanh", ElementwiseOp::kGeluTanh, x, nullptr, out);
  return out;
}

namespace {

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

// The backward ops of the activations (autograd.cpp's `<op>_backward`): the forward's inputs
// and grad_out (d loss / d out) in, one gradient per input out, the activation recomputed.
ElementwiseParams backward_params(ElementwiseOp op, const Rows& a, const Rows* b, const Rows& grad, at::Tensor& out,
                                  int64_t out_row_stride) {
  ElementwiseParams p = make_params(op, a, b, out);
  p.out_row_stride = out_row_stride;
  p.grad = grad.tensor.const_data_ptr();
  p.grad_row_stride = grad.row_stride;
  return p;
}

at::Tensor gelu_tanh_backward(const at::Tensor& grad_out, const at::Tensor& x) {
  check_activation(x, "x");
  const at::Tensor g = last_dim_contiguous(grad_out);
  check_like(g, "grad_out", x, "x");
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  const Rows x_rows = as_rows(x);
  if (x_rows.rows == 0 || x_rows.cols == 0) return grad_x;
  const Rows g_rows = as_rows(g);
  run(backward_params(ElementwiseOp::kGeluTanhBackward, x_rows, nullptr, g_rows, grad_x, x_rows.cols), x,
      "gelu_tanh_backward");
  return grad_x;
}

std::tuple<at::Tensor, at::Tensor> and_mul_backward(const char* name, ElementwiseOp op, const at::Tensor& grad_out,
                                                    const at::Tensor& a, const at::Tensor& b) {
  check_activation(a, "a");
  check_like(b, "b", a, "a");
  const at::Tensor g = last_dim_contiguous(grad_out);
  check_like(g, "grad_out", a, "a");
  at::Tensor grad_a = at::empty(a.sizes(), a.options());
  at::Tensor grad_b = at::empty(b.sizes(), b.options());
  const Rows a_rows = as_rows(a);
  if (a_rows.rows == 0 || a_rows.cols == 0) return {grad_a, grad_b};
  const Rows b_rows = as_rows(b);
  const Rows g_rows = as_rows(g);
  ElementwiseParams p = backward_params(op, a_rows, &b_rows, g_rows, grad_a, a_rows.cols);
  p.out_b = grad_b.mutable_data_ptr();
  p.out_b_row_stride = a_rows.cols;
  run(p, a, name);
  return {grad_a, grad_b};
}

std::tuple<at::Tensor, at::Tensor> gelu_tanh_and_mul_backward(const at::Tensor& grad_out, const at::Tensor& a,
                                                              const at::Tensor& b) {
  return and_mul_backward("gelu_tanh_and_mul_backward", ElementwiseOp::kGeluTanhAndMulBackward, grad_out, a, b);
}

std::tuple<at::Tensor, at::Tensor> gelu_and_mul_backward(const at::Tensor& grad_out, const at::Tensor& a,
                                                         const at::Tensor& b) {
  return and_mul_backward("gelu_and_mul_backward", ElementwiseOp::kGeluAndMulBackward, grad_out, a, b);
}

std::tuple<at::Tensor, at::Tensor> silu_and_mul_backward(const at::Tensor& grad_out, const at::Tensor& a,
                                                         const at::Tensor& b) {
  return and_mul_backward("silu_and_mul_backward", ElementwiseOp::kSiluAndMulBackward, grad_out, a, b);
}

// The backward op of a gated activation over [a | b] (ElementwiseOp of the forward).
ElementwiseOp backward_of(ElementwiseOp op) {
  switch (op) {
    case ElementwiseOp::kGeluTanhAndMul: return ElementwiseOp::kGeluTanhAndMulBackward;
    case ElementwiseOp::kGeluAndMul: return ElementwiseOp::kGeluAndMulBackward;
    default: return ElementwiseOp::kSiluAndMulBackward;
  }
}

void check_grad_of_concatenated(const at::Tensor& grad_out, const at::Tensor& x) {
  TORCH_CHECK_TYPE(grad_out.scalar_type() == x.scalar_type(), "grad_out must have the dtype of x (",
                   x.scalar_type(), "), got ", grad_out.scalar_type());
  TORCH_CHECK_VALUE(grad_out.device() == x.device(), "grad_out must be on the device of x (",
                    device_str(x.device()), "), got ", device_str(grad_out.device()));
  const c10::SymDimVector shape = half_shape(x);
  TORCH_CHECK_VALUE(grad_out.sym_sizes() == c10::SymIntArrayRef(shape), "grad_out must have shape ",
                    dims_str(shape), " (x's with the last dim halved), got ", dims_str(grad_out.sym_sizes()));
}

// x = [a | b]: the two halves' gradients side by side in one tensor of x's shape.
at::Tensor concatenated_backward(const char* name, ElementwiseOp op, const at::Tensor& grad_out, const at::Tensor& x) {
  check_concatenated(x, name);
  const at::Tensor g = last_dim_contiguous(grad_out);
  check_grad_of_concatenated(g, x);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  const int64_t h = x.size(-1) / 2;
  const Rows a_rows = as_rows(x.narrow(-1, 0, h));
  if (a_rows.rows == 0 || a_rows.cols == 0) return grad_x;
  const Rows b_rows = as_rows(x.narrow(-1, h, h));
  const Rows g_rows = as_rows(g);
  ElementwiseParams p = backward_params(backward_of(op), a_rows, &b_rows, g_rows, grad_x, 2 * h);
  p.out_b = static_cast<char*>(grad_x.mutable_data_ptr()) + h * grad_x.element_size();
  p.out_b_row_stride = 2 * h;
  run(p, x, name);
  return grad_x;
}

at::Tensor geglu_backward(const at::Tensor& grad_out, const at::Tensor& x, c10::string_view approximate) {
  return concatenated_backward("geglu_backward", gelu_op(approximate), grad_out, x);
}

at::Tensor swiglu_backward(const at::Tensor& grad_out, const at::Tensor& x) {
  return concatenated_backward("swiglu_backward", ElementwiseOp::kSiluAndMul, grad_out, x);
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

at::Tensor gelu_tanh_backward_meta(const at::Tensor& grad_out, const at::Tensor& x) {
  check_activation(x, "x");
  check_like(last_dim_contiguous(grad_out), "grad_out", x, "x");
  return like_meta(x);
}

std::tuple<at::Tensor, at::Tensor> and_mul_backward_meta(const at::Tensor& grad_out, const at::Tensor& a,
                                                         const at::Tensor& b) {
  check_activation(a, "a");
  check_like(b, "b", a, "a");
  check_like(last_dim_contiguous(grad_out), "grad_out", a, "a");
  return {like_meta(a), like_meta(b)};
}

at::Tensor geglu_backward_meta(const at::Tensor& grad_out, const at::Tensor& x, c10::string_view approximate) {
  check_concatenated(x, "geglu_backward");
  gelu_op(approximate);
  check_grad_of_concatenated(grad_out, x);
  return like_meta(x);
}

at::Tensor swiglu_backward_meta(const at::Tensor& grad_out, const at::Tensor& x) {
  check_concatenated(x, "swiglu_backward");
  check_grad_of_concatenated(grad_out, x);
  return like_meta(x);
}

void register_impls(torch::Library& m) {
  LTX_KERNELS_IMPL(m, "gelu_tanh", gelu_tanh);
  LTX_KERNELS_IMPL(m, "gelu_tanh_and_mul", gelu_tanh_and_mul);
  LTX_KERNELS_IMPL(m, "gelu_and_mul", gelu_and_mul);
  LTX_KERNELS_IMPL(m, "silu_and_mul", silu_and_mul);
  LTX_KERNELS_IMPL(m, "geglu", geglu);
  LTX_KERNELS_IMPL(m, "geglu.out", geglu_out);
  LTX_KERNELS_IMPL(m, "swiglu", swiglu);
  LTX_KERNELS_IMPL(m, "swiglu.out", swiglu_out);
  LTX_KERNELS_IMPL(m, "gated_residual", gated_residual);
  LTX_KERNELS_IMPL(m, "gelu_tanh_backward", gelu_tanh_backward);
  LTX_KERNELS_IMPL(m, "gelu_tanh_and_mul_backward", gelu_tanh_and_mul_backward);
  LTX_KERNELS_IMPL(m, "gelu_and_mul_backward", gelu_and_mul_backward);
  LTX_KERNELS_IMPL(m, "silu_and_mul_backward", silu_and_mul_backward);
  LTX_KERNELS_IMPL(m, "geglu_backward", geglu_backward);
  LTX_KERNELS_IMPL(m, "swiglu_backward", swiglu_backward);
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) { register_impls(m); }

#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) { register_impls(m); }
#endif

LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  LTX_KERNELS_IMPL(m, "gelu_tanh", gelu_tanh_meta);
  LTX_KERNELS_IMPL(m, "gelu_tanh_and_mul", and_mul_meta);
  LTX_KERNELS_IMPL(m, "gelu_and_mul", and_mul_meta);
  LTX_KERNELS_IMPL(m, "silu_and_mul", and_mul_meta);
  LTX_KERNELS_IMPL(m, "geglu", geglu_meta);
  LTX_KERNELS_IMPL(m, "geglu.out", geglu_out_meta);
  LTX_KERNELS_IMPL(m, "swiglu", swiglu_meta);
  LTX_KERNELS_IMPL(m, "swiglu.out", swiglu_out_meta);
  LTX_KERNELS_IMPL(m, "gated_residual", gated_residual_meta);
  LTX_KERNELS_IMPL(m, "gelu_tanh_backward", gelu_tanh_backward_meta);
  LTX_KERNELS_IMPL(m, "gelu_tanh_and_mul_backward", and_mul_backward_meta);
  LTX_KERNELS_IMPL(m, "gelu_and_mul_backward", and_mul_backward_meta);
  LTX_KERNELS_IMPL(m, "silu_and_mul_backward", and_mul_backward_meta);
  LTX_KERNELS_IMPL(m, "geglu_backward", geglu_backward_meta);
  LTX_KERNELS_IMPL(m, "swiglu_backward", swiglu_backward_meta);
}

}  // namespace ltx_kernels::torch_ext

// CPU reference of the elementwise family: the formulas of elementwise.h in double.
#include <stdexcept>

#include "ltx_kernels/elementwise.h"
#include "reference/activation.h"
#include "reference/convert.h"

namespace ltx_kernels {

void reference(const ElementwiseParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  using host::gelu;
  using host::gelu_grad;
  using host::gelu_tanh;
  using host::gelu_tanh_grad;
  using host::load;
  using host::silu;
  using host::silu_grad;
  for (int64_t row = 0; row < p.rows; ++row) {
    const int64_t gate_at = (row / p.tokens) * p.gate.batch_stride +
                            (row % p.tokens) * p.gate.token_stride;
    for (int64_t c = 0; c < p.cols; ++c) {
      const double a = load(p.a, row * p.a_row_stride + c, p.dtype);
      const double b = p.b ? load(p.b, row * p.b_row_stride + c, p.dtype) : 0.0;
      const double g = p.grad ? load(p.grad, row * p.grad_row_stride + c, p.dtype) : 0.0;
      double y = 0.0;
      double y_b = 0.0;  // out_b's element
      switch (p.op) {
        case ElementwiseOp::kGeluTanh: y = gelu_tanh(a); break;
        case ElementwiseOp::kGeluTanhAndMul: y = gelu_tanh(a) * b; break;
        case ElementwiseOp::kGeluAndMul: y = gelu(a) * b; break;
        case ElementwiseOp::kSiluAndMul: y = silu(a) * b; break;
        case ElementwiseOp::kGatedResidual:
          y = a + b * (p.gate.ptr ? load(p.gate.ptr, gate_at + c, p.dtype) : 1.0);
          break;
        case ElementwiseOp::kGeluTanhBackward: y = g * gelu_tanh_grad(a); break;
        case ElementwiseOp::kGeluTanhAndMulBackward:
          y = g * b * gelu_tanh_grad(a);
          y_b = g * gelu_tanh(a);
          break;
        case ElementwiseOp::kGeluAndMulBackward:
          y = g * b * gelu_grad(a);
          y_b = g * gelu(a);
          break;
        case ElementwiseOp::kSiluAndMulBackward:
          y = g * b * silu_grad(a);
          y_b = g * silu(a);
          break;
      }
      host::store(p.out, row * p.out_row_stride + c, p.dtype, static_cast<float>(y));
      if (has_out_b(p.op)) host::store(p.out_b, row * p.out_b_row_stride + c, p.dtype, static_cast<float>(y_b));
    }
  }
}

}  // namespace ltx_kernels

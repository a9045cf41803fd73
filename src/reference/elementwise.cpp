// CPU reference of the elementwise family: the formulas of elementwise.h in double.
#include <stdexcept>

#include "ltx_kernels/elementwise.h"
#include "reference/activation.h"
#include "reference/convert.h"

namespace ltx_kernels {

void reference(const ElementwiseParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  using host::gelu;
  using host::gelu_tanh;
  using host::load;
  using host::silu;
  for (int64_t row = 0; row < p.rows; ++row) {
    const int64_t gate_at = (row / p.tokens) * p.gate.batch_stride +
                            (row % p.tokens) * p.gate.token_stride;
    for (int64_t c = 0; c < p.cols; ++c) {
      const double a = load(p.a, row * p.a_row_stride + c, p.dtype);
      const double b = p.b ? load(p.b, row * p.b_row_stride + c, p.dtype) : 0.0;
      double y = 0.0;
      switch (p.op) {
        case ElementwiseOp::kGeluTanh: y = gelu_tanh(a); break;
        case ElementwiseOp::kGeluTanhAndMul: y = gelu_tanh(a) * b; break;
        case ElementwiseOp::kGeluAndMul: y = gelu(a) * b; break;
        case ElementwiseOp::kSiluAndMul: y = silu(a) * b; break;
        case ElementwiseOp::kGatedResidual:
          y = a + b * (p.gate.ptr ? load(p.gate.ptr, gate_at + c, p.dtype) : 1.0);
          break;
      }
      host::store(p.out, row * p.out_row_stride + c, p.dtype, static_cast<float>(y));
    }
  }
}

}  // namespace ltx_kernels

// Host-side logic of the elementwise family: argument validation and the vector width.
#include "ltx_kernels/elementwise.h"
#include "ops/host_util.h"

namespace ltx_kernels {

ValidationError validate(const ElementwiseParams& p) {
  if (p.rows < 0) return "rows must be >= 0";
  if (p.cols < 0) return "cols must be >= 0";
  if (p.op < ElementwiseOp::kGeluTanh || p.op > ElementwiseOp::kSiluAndMulBackward)
    return "unknown elementwise op";
  if (p.gate.ptr != nullptr && p.op != ElementwiseOp::kGatedResidual)
    return "gate is only defined for the gated residual";
  if (p.tokens < 1) return "tokens must be >= 1";
  if (p.rows % p.tokens != 0) return "rows must be a multiple of tokens";
  if (p.gate.batch_stride < 0 || p.gate.token_stride < 0) return "gate strides must be >= 0";
  if (p.rows == 0 || p.cols == 0) return nullptr;
  if (p.a == nullptr) return "a is null";
  if (has_b(p.op) && p.b == nullptr) return "b is null";
  if (is_backward(p.op) && p.grad == nullptr) return "grad is null";
  if (p.out == nullptr) return "out is null";
  if (has_out_b(p.op) && p.out_b == nullptr) return "out_b is null";
  if (p.a_row_stride < 0 || p.b_row_stride < 0 || p.grad_row_stride < 0)
    return "input row strides must be >= 0";
  if (p.rows > 1 && p.out_row_stride < p.cols) return "out rows overlap (out_row_stride < cols)";
  if (has_out_b(p.op) && p.rows > 1 && p.out_b_row_stride < p.cols)
    return "out_b rows overlap (out_b_row_stride < cols)";
  return nullptr;
}

int elementwise_vector(const ElementwiseParams& p) {
  using host_util::aligned16;
  const int vec = 16 / dtype_size(p.dtype);
  const bool ok = p.cols % vec == 0 && p.a_row_stride % vec == 0 && p.b_row_stride % vec == 0 &&
                  p.grad_row_stride % vec == 0 && p.out_row_stride % vec == 0 &&
                  p.out_b_row_stride % vec == 0 && aligned16(p.a) && aligned16(p.b) &&
                  aligned16(p.grad) && aligned16(p.out) && aligned16(p.out_b) &&
                  host_util::aligned_vectors(p.gate, vec);
  return ok ? vec : 1;
}

}  // namespace ltx_kernels

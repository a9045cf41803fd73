// Host-side logic of the AdaLN RMS norm backward: argument validation and the vector width.
#include "ltx_kernels/adaln_backward.h"

#include "ops/host_util.h"

namespace ltx_kernels {

ValidationError validate(const AdalnBackwardParams& p) {
  if (p.rows < 0) return "rows must be >= 0";
  if (p.cols < 0) return "cols must be >= 0";
  if (!(p.eps >= 0.0f)) return "eps must be >= 0";
  if (p.tokens < 1 || p.rows % p.tokens != 0) return "rows must be a multiple of tokens (>= 1)";
  if (p.gate.ptr != nullptr && p.y == nullptr) return "gate needs y (the gated form)";
  if ((p.y == nullptr) != (p.grad_h == nullptr) || (p.y == nullptr) != (p.dy == nullptr))
    return "y, grad_h and dy go together (the gated form)";
  if ((p.weight == nullptr) != (p.dw == nullptr)) return "weight and dw go together";
  if ((p.gate.ptr == nullptr) != (p.dg == nullptr)) return "gate and dg go together";
  if (p.rows == 0 || p.cols == 0) return nullptr;
  if (p.x == nullptr) return "x is null";
  if (p.scale.ptr == nullptr) return "scale is null";
  if (p.grad_out == nullptr) return "grad_out is null";
  if (p.dx == nullptr) return "dx is null";
  if (p.gn == nullptr) return "gn is null";
  if (p.x_row_stride < 0 || p.y_row_stride < 0 || p.grad_out_row_stride < 0 || p.grad_h_row_stride < 0)
    return "input row strides must be >= 0";
  if (p.rows > 1 && p.dx_row_stride < p.cols) return "dx rows overlap (dx_row_stride < cols)";
  if (p.dy != nullptr && p.rows > 1 && p.dy_row_stride < p.cols) return "dy rows overlap (dy_row_stride < cols)";
  return nullptr;
}

int adaln_backward_vector(const AdalnBackwardParams& p) {
  using host_util::aligned16;
  using host_util::aligned_vectors;
  const int vec = 16 / dtype_size(p.dtype);
  const bool ok = p.cols % vec == 0 && p.x_row_stride % vec == 0 && p.y_row_stride % vec == 0 &&
                  p.grad_out_row_stride % vec == 0 && p.grad_h_row_stride % vec == 0 &&
                  p.dx_row_stride % vec == 0 && p.dy_row_stride % vec == 0 && aligned16(p.x) && aligned16(p.y) &&
                  aligned16(p.grad_out) && aligned16(p.grad_h) && aligned16(p.dx) && aligned16(p.dy) &&
                  aligned16(p.weight) && aligned16(p.gn) && aligned16(p.dw) && aligned16(p.dg) &&
                  aligned_vectors(p.gate, vec) && aligned_vectors(p.scale, vec);
  return ok ? vec : 1;
}

}  // namespace ltx_kernels

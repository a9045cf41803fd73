// Host-side logic of FP8 quantization: argument validation and the vector width.
#include "ltx_kernels/quantize.h"
#include "ops/host_util.h"

namespace ltx_kernels {

ValidationError validate(const QuantizeParams& p) {
  if (p.rows < 0) return "rows must be >= 0";
  if (p.cols < 0) return "cols must be >= 0";
  if (p.activation != Fp8Activation::kNone && p.activation != Fp8Activation::kGeluTanh)
    return "unknown activation";
  if (p.rows == 0) return nullptr;
  if (p.scale == nullptr) return "scale is null";
  if (p.cols == 0) return nullptr;
  if (p.x == nullptr) return "x is null";
  if (p.out == nullptr) return "out is null";
  if (p.x_row_stride < 0) return "x_row_stride must be >= 0";
  if (p.rows > 1 && p.out_row_stride < p.cols) return "out rows overlap (out_row_stride < cols)";
  return nullptr;
}

int quantize_vector(const QuantizeParams& p) {
  using host_util::aligned16;
  const int vec = 16 / dtype_size(p.dtype);
  // The fp8 output is written vec bytes at a time: its rows must start vec-aligned too.
  const bool ok = p.cols % vec == 0 && p.x_row_stride % vec == 0 && p.out_row_stride % vec == 0 &&
                  aligned16(p.x) && reinterpret_cast<uintptr_t>(p.out) % vec == 0;
  return ok ? vec : 1;
}

}  // namespace ltx_kernels

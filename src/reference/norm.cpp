// CPU reference of the norm family: the formulas of norm.h, accumulated in double.
// (residual + x * gate is formed in float, as the kernels do, then rounded to the dtype.)
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "ltx_kernels/norm.h"
#include "reference/convert.h"
#include "reference/fp8.h"

namespace ltx_kernels {

void reference(const NormParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  using host::load;
  using host::store;
  std::vector<float> h(static_cast<size_t>(p.cols)), out(static_cast<size_t>(p.cols));
  for (int64_t row = 0; row < p.rows; ++row) {
    // Offset of this row's vector in a RowVectors.
    const auto at = [&](const RowVectors& v) {
      return (row / p.tokens) * v.batch_stride + (row % p.tokens) * v.token_stride;
    };
    for (int64_t c = 0; c < p.cols; ++c) {
      float v = load(p.x, row * p.x_row_stride + c, p.dtype);
      if (p.gate.ptr) v *= load(p.gate.ptr, at(p.gate) + c, p.dtype);
      if (p.residual) {
        v = host::round_to(v + load(p.residual, row * p.residual_row_stride + c, p.dtype),
                           p.dtype);
      }
      h[c] = v;
    }
    // Write the new residual only after reading the whole row: new_residual may alias it.
    if (p.new_residual) {
      for (int64_t c = 0; c < p.cols; ++c)
        store(p.new_residual, row * p.new_residual_row_stride + c, p.dtype, h[c]);
    }
    double mean = 0.0;
    if (p.type == NormType::kLayer) {
      for (float v : h) mean += v;
      mean /= static_cast<double>(p.cols);
    }
    double sq = 0.0;
    for (float v : h) sq += (v - mean) * (v - mean);
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(p.cols) + p.eps);
    for (int64_t c = 0; c < p.cols; ++c) {
      double y = (h[c] - mean) * rstd;
      if (p.weight) y *= static_cast<double>(load(p.weight, c, p.weight_dtype)) + p.weight_offset;
      if (p.bias) y += load(p.bias, c, p.weight_dtype);
      if (p.scale.ptr) {
        y = y * (1.0 + load(p.scale.ptr, at(p.scale) + c, p.dtype)) +
            load(p.shift.ptr, at(p.shift) + c, p.dtype);
      }
      out[c] = host::round_to(static_cast<float>(y), p.out_dtype);
      if (p.out) store(p.out, row * p.out_row_stride + c, p.out_dtype, out[c]);
    }
    if (p.out_fp8) {
      host::quantize_row(out.data(), p.cols, p.out_fp8 + row * p.out_fp8_row_stride, p.out_fp8_scale + row);
    }
  }
}

}  // namespace ltx_kernels

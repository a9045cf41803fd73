// CPU reference of the AdaLN RMS norm backward (include/ltx_kernels/adaln_backward.h), in fp32.
#include <cmath>
#include <stdexcept>
#include <vector>

#include "ltx_kernels/adaln_backward.h"
#include "reference/convert.h"

namespace ltx_kernels {

void reference(const AdalnBackwardParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  const int64_t n = p.cols;
  std::vector<float> h(n), y(n), dn(n);
  // Element c of row r's vector of v.
  const auto at = [&](const RowVectors& v, int64_t r, int64_t c) {
    return host::load(v.ptr, (r / p.tokens) * v.batch_stride + (r % p.tokens) * v.token_stride + c, p.dtype);
  };
  for (int64_t r = 0; r < p.rows; ++r) {
    float sum_sq = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
      float v = host::load(p.x, r * p.x_row_stride + c, p.dtype);
      if (p.y) {
        y[c] = host::load(p.y, r * p.y_row_stride + c, p.dtype);
        v = host::round_to(v + (p.gate.ptr ? y[c] * at(p.gate, r, c) : y[c]), p.dtype);
      }
      h[c] = v;
      sum_sq += v * v;
    }
    const float rstd = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + p.eps);
    float dot = 0.0f;  // sum of dxhat * xhat
    for (int64_t c = 0; c < n; ++c) {
      const float g = host::load(p.grad_out, r * p.grad_out_row_stride + c, p.dtype);
      const float w = p.weight ? p.weight[c] : 1.0f;
      const float xhat = h[c] * rstd;
      dn[c] = g * (1.0f + at(p.scale, r, c));
      dot += dn[c] * w * xhat;
      p.gn[r * n + c] = g * xhat * w;
      if (p.dw) p.dw[r * n + c] = dn[c] * xhat;
    }
    const float mean = dot / static_cast<float>(n);
    for (int64_t c = 0; c < n; ++c) {
      const float w = p.weight ? p.weight[c] : 1.0f;
      float d = rstd * (dn[c] * w - h[c] * rstd * mean);
      if (p.y) d += host::load(p.grad_h, r * p.grad_h_row_stride + c, p.dtype);
      host::store(p.dx, r * p.dx_row_stride + c, p.dtype, d);
      if (p.y) host::store(p.dy, r * p.dy_row_stride + c, p.dtype, p.gate.ptr ? d * at(p.gate, r, c) : d);
      if (p.dg) p.dg[r * n + c] = d * y[c];
    }
  }
}

}  // namespace ltx_kernels

// CPU reference of linear_gated_residual (include/ltx_kernels/linear_gated_residual.h).
#include <vector>

#include "ltx_kernels/linear_gated_residual.h"
#include "reference/convert.h"

namespace ltx_kernels {

void reference(const LinearGatedResidualParams& p) {
  // b decoded once; each output is then a plain fp32 dot product, summed in k order.
  std::vector<float> b(static_cast<size_t>(p.n * p.k)), a(static_cast<size_t>(p.k));
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t k = 0; k < p.k; ++k) b[n * p.k + k] = host::load(p.b, n * p.b_row_stride + k, p.dtype);
  for (int64_t m = 0; m < p.m; ++m) {
    for (int64_t k = 0; k < p.k; ++k) a[k] = host::load(p.a, m * p.a_row_stride + k, p.dtype);
    const int64_t gate_row = m / p.batch_rows * p.gate_batch_stride;
    for (int64_t n = 0; n < p.n; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < p.k; ++k) acc += a[k] * b[n * p.k + k];
      if (p.bias != nullptr) acc += host::load(p.bias, n, p.dtype);
      const float gate = p.gate != nullptr ? host::load(p.gate, gate_row + n, p.dtype) : 1.0f;
      host::store(p.out, m * p.out_row_stride + n, p.dtype,
                  host::load(p.residual, m * p.residual_row_stride + n, p.dtype) + gate * acc);
    }
  }
}

}  // namespace ltx_kernels

// CPU reference of the FP8 linear (include/ltx_kernels/fp8_linear.h).
#include <array>
#include <vector>

#include "ltx_kernels/fp8_linear.h"
#include "reference/activation.h"
#include "reference/convert.h"

namespace ltx_kernels {
namespace {

const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = host::e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

}  // namespace

void reference(const Fp8LinearParams& p) {
  const auto& value = e4m3_values();
  // b decoded once; each output is then a plain fp32 dot product, summed in k order.
  std::vector<float> b(static_cast<size_t>(p.n * p.k)), a(static_cast<size_t>(p.k));
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t k = 0; k < p.k; ++k) b[n * p.k + k] = value[p.b[n * p.b_row_stride + k]];
  for (int64_t m = 0; m < p.m; ++m) {
    for (int64_t k = 0; k < p.k; ++k) a[k] = value[p.a[m * p.a_row_stride + k]];
    for (int64_t n = 0; n < p.n; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < p.k; ++k) acc += a[k] * b[n * p.k + k];
      float v = acc * p.a_scale[m] * p.b_scale[n];
      if (p.bias != nullptr) v += host::load(p.bias, n, p.out_dtype);
      if (p.activation == Fp8Activation::kGeluTanh) v = static_cast<float>(host::gelu_tanh(v));
      if (p.residual != nullptr) {
        const float gate =
            p.gate != nullptr ? host::load(p.gate, m / p.batch_rows * p.gate_batch_stride + n, p.out_dtype) : 1.0f;
        v = host::load(p.residual, m * p.residual_row_stride + n, p.out_dtype) + gate * v;
      }
      host::store(p.out, m * p.out_row_stride + n, p.out_dtype, v);
    }
  }
}

}  // namespace ltx_kernels

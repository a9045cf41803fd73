// CPU reference of FP8 row quantization: the exact semantics of quantize.h, in fp32 as the
// kernel computes them (the rounding of each step is part of the format).
#include <cmath>
#include <stdexcept>

#include "ltx_kernels/quantize.h"
#include "reference/activation.h"
#include "reference/convert.h"

namespace ltx_kernels {

namespace {

// max that propagates NaN, as the kernel's.
float nan_max(float a, float b) { return (a > b || std::isnan(a)) ? a : b; }

}  // namespace

void reference(const QuantizeParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  const auto value = [&](int64_t i) {
    const float x = host::load(p.x, i, p.dtype);
    return p.activation == QuantizeActivation::kGeluTanh ? static_cast<float>(host::gelu_tanh(x)) : x;
  };
  for (int64_t row = 0; row < p.rows; ++row) {
    const int64_t base = row * p.x_row_stride;
    float amax = 0.0f;
    for (int64_t c = 0; c < p.cols; ++c) amax = nan_max(amax, std::fabs(value(base + c)));
    amax = nan_max(amax, kMinAmax);
    const float inv = kFp8E4m3Max / amax;
    p.scale[row] = amax / kFp8E4m3Max;
    for (int64_t c = 0; c < p.cols; ++c) {
      const float v = value(base + c) * inv;
      p.out[row * p.out_row_stride + c] = host::float_to_e4m3(v);
    }
  }
}

}  // namespace ltx_kernels

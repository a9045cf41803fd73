// quantize.h's FP8 row format on the host: the exact semantics that every kernel writing it
// is held to (quantize_fp8, the norms' FP8 outputs).
#pragma once

#include <cmath>
#include <cstdint>

#include "ltx_kernels/quantize.h"
#include "reference/convert.h"

namespace ltx_kernels::host {

// max that propagates NaN, as the kernels'.
inline float nan_max(float a, float b) { return (a > b || std::isnan(a)) ? a : b; }

// values[0, n) -> e4m3 bytes out[0, n) and the row's scale.
inline void quantize_row(const float* values, int64_t n, uint8_t* out, float* scale) {
  float amax = 0.0f;
  for (int64_t c = 0; c < n; ++c) amax = nan_max(amax, std::fabs(values[c]));
  amax = nan_max(amax, kMinAmax);
  const float inv = kFp8E4m3Max / amax;
  *scale = amax / kFp8E4m3Max;
  for (int64_t c = 0; c < n; ++c) out[c] = float_to_e4m3(values[c] * inv);
}

}  // namespace ltx_kernels::host

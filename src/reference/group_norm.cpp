// CPU reference of group_norm (group_norm.h): each group's mean and variance in double (two
// passes), the output in double, rounded once to the dtype.
#include <cmath>
#include <stdexcept>

#include "ltx_kernels/group_norm.h"
#include "reference/convert.h"

namespace ltx_kernels {

void reference(const GroupNormParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  using host::load;
  const int64_t per_group = p.channels / p.groups;
  // Element (n, c, s) of x and out in their layout.
  const auto at = [&](int64_t n, int64_t c, int64_t s) {
    return p.channels_last ? (n * p.spatial + s) * p.channels + c : (n * p.channels + c) * p.spatial + s;
  };
  for (int64_t n = 0; n < p.batch; ++n) {
    for (int64_t g = 0; g < p.groups; ++g) {
      const int64_t c0 = g * per_group;
      const auto h = [&](int64_t c, int64_t s) {
        const double add = p.add ? load(p.add, n * p.channels + c, p.dtype) : 0.0f;
        return static_cast<double>(load(p.x, at(n, c, s), p.dtype)) + add;
      };
      const double count = static_cast<double>(per_group * p.spatial);
      double mean = 0.0, var = 0.0;
      for (int64_t c = c0; c < c0 + per_group; ++c)
        for (int64_t s = 0; s < p.spatial; ++s) mean += h(c, s);
      mean /= count;
      for (int64_t c = c0; c < c0 + per_group; ++c)
        for (int64_t s = 0; s < p.spatial; ++s) var += (h(c, s) - mean) * (h(c, s) - mean);
      const double rstd = 1.0 / std::sqrt(var / count + p.eps);
      for (int64_t c = c0; c < c0 + per_group; ++c) {
        const double w = p.weight ? load(p.weight, c, p.weight_dtype) : 1.0f;
        const double b = p.bias ? load(p.bias, c, p.weight_dtype) : 0.0f;
        for (int64_t s = 0; s < p.spatial; ++s) {
          double y = (h(c, s) - mean) * rstd * w + b;
          if (p.silu) y = y / (1.0 + std::exp(-y));
          host::store(p.out, at(n, c, s), p.dtype, static_cast<float>(y));
        }
      }
    }
  }
}

}  // namespace ltx_kernels

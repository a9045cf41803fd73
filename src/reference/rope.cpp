// CPU reference of the RoPE family: the formulas of rope.h in double.
#include <cmath>
#include <stdexcept>
#include <vector>

#include "ltx_kernels/rope.h"
#include "reference/convert.h"

namespace ltx_kernels {

namespace {

// Partner channel of c < rotary dims and the sign of its contribution (-1 for the first
// element of a pair, +1 for the second).
std::pair<int64_t, double> partner(const RopeParams& p, int64_t c) {
  if (p.interleaved) return {c ^ 1, (c % 2 == 0) ? -1.0 : 1.0};
  int64_t start = 0;
  for (int64_t n : p.sections) {
    if (c < start + n) {
      const int64_t half = n / 2;
      return c - start < half ? std::make_pair(c + half, -1.0) : std::make_pair(c - half, 1.0);
    }
    start += n;
  }
  return {c, 0.0};  // unreachable for c < rotary dims
}

void rotate_tensor(const RopeParams& p, const RopeTensor& t) {
  using host::load;
  const int64_t rot = rotary_dims(p);
  for (int64_t b = 0; b < p.batches; ++b) {
    for (int64_t s = 0; s < p.tokens; ++s) {
      const int64_t table = (p.table_batch_stride ? b * p.table_batch_stride : 0) +
                            s * p.table_token_stride;
      for (int64_t h = 0; h < t.heads; ++h) {
        const int64_t in = b * t.in_strides[0] + s * t.in_strides[1] + h * t.in_strides[2];
        const int64_t out = b * t.out_strides[0] + s * t.out_strides[1] + h * t.out_strides[2];
        for (int64_t c = 0; c < p.head_dim; ++c) {
          double y = load(t.in, in + c, p.dtype);
          if (c < rot) {
            const auto [other, sign] = partner(p, c);
            y = y * load(p.cos, table + c, p.table_dtype) +
                sign * load(t.in, in + other, p.dtype) * load(p.sin, table + c, p.table_dtype);
          }
          host::store(t.out, out + c, p.dtype, static_cast<float>(y));
        }
      }
    }
  }
}

}  // namespace

void reference(const RopeParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  rotate_tensor(p, p.q);
  if (p.k.in) rotate_tensor(p, p.k);
}

namespace {

void ltx_rotate_row(const LtxRopeParams& p, const void* in, void* out, const void* weight,
                    const std::vector<double>& angle) {
  using host::load;
  std::vector<double> x(static_cast<size_t>(p.cols));
  for (int64_t c = 0; c < p.cols; ++c) x[c] = load(in, c, p.dtype);
  if (p.norm) {
    double sq = 0.0;
    for (double v : x) sq += v * v;
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(p.cols) + p.eps);
    for (int64_t c = 0; c < p.cols; ++c)
      x[c] *= rstd * (weight ? static_cast<double>(load(weight, c, p.dtype)) : 1.0);
  }
  const int64_t identity = p.cols % 6;
  for (int64_t c = 0; c < p.cols; ++c) {
    double y = x[c];
    if (c >= identity) {
      const int64_t j = (c - identity) / 2;
      const bool first = (c - identity) % 2 == 0;
      const double other = first ? -x[c + 1] : x[c - 1];
      y = x[c] * std::cos(angle[j]) + other * std::sin(angle[j]);
    }
    host::store(out, c, p.dtype, static_cast<float>(y));
  }
}

}  // namespace

void reference(const LtxRopeParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  const int64_t freqs = p.cols / 6;
  std::vector<double> freq(static_cast<size_t>(freqs));
  for (int64_t k = 0; k < freqs; ++k) {
    const double exponent = freqs > 1 ? static_cast<double>(k) / static_cast<double>(freqs - 1) : 0.0;
    freq[k] = std::pow(p.theta, exponent) * M_PI / 2.0;
  }
  std::vector<double> angle(static_cast<size_t>(3 * freqs));
  const int64_t dh = dtype_size(p.dtype);  // bytes per element
  for (int64_t b = 0; b < p.batches; ++b) {
    for (int64_t s = 0; s < p.tokens; ++s) {
      double pos[3];
      if (p.coords) {
        for (int a = 0; a < 3; ++a)
          pos[a] = p.coords[b * p.coords_strides[0] + a * p.coords_strides[1] +
                            s * p.coords_strides[2]];
      } else {
        const int64_t hw = p.grid[1] * p.grid[2];
        pos[0] = static_cast<double>(s / hw);
        pos[1] = static_cast<double>((s / p.grid[2]) % p.grid[1]);
        pos[2] = static_cast<double>(s % p.grid[2]);
      }
      for (int64_t j = 0; j < 3 * freqs; ++j)
        angle[j] = freq[j / 3] * (2.0 * pos[j % 3] * p.axis_scale[j % 3] - 1.0);
      const int64_t row = b * p.tokens + s;
      ltx_rotate_row(p, static_cast<const char*>(p.q) + row * p.q_row_stride * dh,
                     static_cast<char*>(p.q_out) + row * p.cols * dh, p.q_weight, angle);
      if (p.k) {
        ltx_rotate_row(p, static_cast<const char*>(p.k) + row * p.k_row_stride * dh,
                       static_cast<char*>(p.k_out) + row * p.cols * dh, p.k_weight, angle);
      }
    }
  }
}

}  // namespace ltx_kernels

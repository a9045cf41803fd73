// CPU reference of the cross-entropy row passes (include/ltx_kernels/cross_entropy.h), in fp32.
#include <cmath>
#include <stdexcept>

#include "ltx_kernels/cross_entropy.h"
#include "reference/convert.h"

namespace ltx_kernels {
namespace {

float logit(const CrossEntropyChunk& c, int64_t row, int64_t j) {
  const float l = c.logits[row * c.logits_row_stride + j];
  return c.bias ? l + host::load(c.bias, j, c.bias_dtype) : l;
}

// The chunk's column of row's target, or -1.
int64_t target_col(const CrossEntropyChunk& c, int64_t row) {
  const int64_t t = c.target[row];
  return t >= c.class0 && t - c.class0 < c.cols ? t - c.class0 : -1;
}

}  // namespace

void reference(const CrossEntropyStatsParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  const CrossEntropyChunk& c = p.chunk;
  for (int64_t r = 0; r < c.rows; ++r) {
    float m = p.row_max[r];
    for (int64_t j = 0; j < c.cols; ++j) m = std::fmax(m, logit(c, r, j));
    if (m != -INFINITY) {
      float sum = p.row_sum[r] * std::exp(p.row_max[r] - m);
      for (int64_t j = 0; j < c.cols; ++j) sum += std::exp(logit(c, r, j) - m);
      p.row_sum[r] = sum;
      p.row_max[r] = m;
    }
    if (const int64_t col = target_col(c, r); col >= 0) p.picked[r] = logit(c, r, col);
  }
}

void reference(const CrossEntropyGradParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  const CrossEntropyChunk& c = p.chunk;
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t col = target_col(c, r);
    for (int64_t j = 0; j < c.cols; ++j) {
      float g = std::exp(logit(c, r, j) - p.lse[r]) * p.softmax_weight[r];
      if (j == col) g -= p.target_weight[r];
      host::store(p.grad, r * p.grad_row_stride + j, p.grad_dtype, g);
    }
  }
}

}  // namespace ltx_kernels

// CPU reference of attention (include/ltx_kernels/attention.h): the exact formula, or the
// 8-bit method's quantization of q and k followed by exact softmax and P v, in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "ltx_kernels/attention.h"
#include "ltx_kernels/quantize.h"
#include "reference/convert.h"

namespace ltx_kernels {

namespace {

// rows x head_dim values of one head of a [B, H, S, D] tensor, in fp32.
std::vector<float> load_head(const void* base, const Strides4& s, DType dtype, int64_t b, int64_t h,
                             int64_t rows, int64_t dim) {
  std::vector<float> out(static_cast<size_t>(rows * dim));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < dim; ++d)
      out[r * dim + d] = host::load(base, b * s.batch + h * s.head + r * s.seq + d, dtype);
  return out;
}

// One head's rows quantized to INT8 in blocks of kQuantBlock rows: values (as float, exact
// integers) and one scale per row (its block's).
struct Int8Rows {
  std::vector<float> values;
  std::vector<float> row_scale;
};

Int8Rows quantize_int8_blocks(const std::vector<float>& x, int64_t rows, int64_t dim) {
  Int8Rows q{std::vector<float>(x.size()), std::vector<float>(static_cast<size_t>(rows))};
  for (int64_t start = 0; start < rows; start += kQuantBlock) {
    const int64_t end = std::min(rows, start + kQuantBlock);
    float amax = 0.0f;
    for (int64_t i = start * dim; i < end * dim; ++i) {
      const float a = std::fabs(x[i]);
      amax = (a > amax || std::isnan(a)) ? a : amax;  // NaN propagates
    }
    amax = (amax > kMinAmax || std::isnan(amax)) ? amax : kMinAmax;
    const float inv = 127.0f / amax;
    for (int64_t i = start * dim; i < end * dim; ++i) {
      const float v = std::nearbyint(x[i] * inv);  // round half to even (default rounding mode)
      q.values[i] = std::isnan(v) ? v : std::clamp(v, -127.0f, 127.0f);
    }
    std::fill(q.row_scale.begin() + start, q.row_scale.begin() + end, amax / 127.0f);
  }
  return q;
}

// k - its mean over the rows, per channel; the mean summed in double and rounded to fp32.
void subtract_channel_mean(std::vector<float>& k, int64_t rows, int64_t dim) {
  if (rows == 0) return;
  for (int64_t d = 0; d < dim; ++d) {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) sum += k[r * dim + d];
    const float mean = static_cast<float>(sum / static_cast<double>(rows));
    for (int64_t r = 0; r < rows; ++r) k[r * dim + d] -= mean;
  }
}

}  // namespace

void reference(const AttentionParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  const int64_t dim = p.head_dim, group = p.heads_q / p.heads_kv;
  const bool int8 = p.precision == AttentionPrecision::kInt8QK;
  std::vector<double> scores(static_cast<size_t>(p.seq_k)), acc(static_cast<size_t>(dim));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      std::vector<float> k = load_head(p.k, p.k_strides, p.dtype, b, hk, p.seq_k, dim);
      const std::vector<float> v = load_head(p.v, p.v_strides, p.dtype, b, hk, p.seq_k, dim);
      Int8Rows k8;
      if (int8) {
        subtract_channel_mean(k, p.seq_k, dim);
        k8 = quantize_int8_blocks(k, p.seq_k, dim);
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const std::vector<float> q = load_head(p.q, p.q_strides, p.dtype, b, h, p.seq_q, dim);
        const Int8Rows q8 = int8 ? quantize_int8_blocks(q, p.seq_q, dim) : Int8Rows{};
        for (int64_t i = 0; i < p.seq_q; ++i) {
          double row_max = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < p.seq_k; ++j) {
            double s = 0.0;
            if (int8) {
              for (int64_t d = 0; d < dim; ++d) s += static_cast<double>(q8.values[i * dim + d]) * k8.values[j * dim + d];
              s = static_cast<double>(static_cast<float>(s) * q8.row_scale[i] * k8.row_scale[j] * p.scale);
            } else {
              for (int64_t d = 0; d < dim; ++d) s += static_cast<double>(q[i * dim + d]) * k[j * dim + d];
              s *= p.scale;
            }
            if (p.mask) s += p.mask[b * p.mask_strides.batch + h * p.mask_strides.head + i * p.mask_strides.seq + j];
            scores[j] = s;
            row_max = (s > row_max || std::isnan(s)) ? s : row_max;  // a NaN score makes the row NaN
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double total = 0.0;
          if (row_max != -std::numeric_limits<double>::infinity()) {  // else: every key masked, out 0
            for (int64_t j = 0; j < p.seq_k; ++j) {
              const double e = std::exp(scores[j] - row_max);
              total += e;
              for (int64_t d = 0; d < dim; ++d) acc[d] += e * v[j * dim + d];
            }
          }
          for (int64_t d = 0; d < dim; ++d) {
            const double o = total == 0.0 ? 0.0 : acc[d] / total;
            host::store(p.out, b * p.out_strides.batch + h * p.out_strides.head + i * p.out_strides.seq + d,
                        p.dtype, static_cast<float>(o));
          }
        }
      }
    }
  }
}

}  // namespace ltx_kernels

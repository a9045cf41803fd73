// CPU reference of attention (include/ltx_kernels/attention.h): the exact formula, or the
// 8-bit method's quantization of q and k followed by exact softmax and P v, in double; for
// kInt8QKPV, v's quantization and P's per step as well.
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

// kInt8QKPV's v: v - its channel mean (as k's), rounded to INT8 with one scale per channel
// over all the rows.
struct Int8Channels {
  std::vector<float> values;  // rows x dim, exact integers
  std::vector<float> scale, mean;  // per channel
};

Int8Channels quantize_int8_channels(std::vector<float> v, int64_t rows, int64_t dim) {
  Int8Channels q{std::vector<float>(v.size()), std::vector<float>(static_cast<size_t>(dim)),
                 std::vector<float>(static_cast<size_t>(dim))};
  for (int64_t d = 0; d < dim; ++d) {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) sum += v[r * dim + d];
    q.mean[d] = rows > 0 ? static_cast<float>(sum / static_cast<double>(rows)) : 0.0f;
  }
  subtract_channel_mean(v, rows, dim);
  for (int64_t d = 0; d < dim; ++d) {
    float amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const float a = std::fabs(v[r * dim + d]);
      amax = (a > amax || std::isnan(a)) ? a : amax;
    }
    amax = (amax > kMinAmax || std::isnan(amax)) ? amax : kMinAmax;
    const float inv = 127.0f / amax;
    for (int64_t r = 0; r < rows; ++r) {
      const float x = std::nearbyint(v[r * dim + d] * inv);
      q.values[r * dim + d] = std::isnan(x) ? x : std::clamp(x, -127.0f, 127.0f);
    }
    q.scale[d] = amax / 127.0f;
  }
  return q;
}

// One row of kInt8QKPV's P v (attention.h): the scores' running max per step of kPVStep keys,
// P rounded to integers in [0, 255] against it, their products with v8 summed per step and
// the steps' sums rescaled to the last max.
void int8_pv_row(const std::vector<double>& scores, const Int8Channels& v8, int64_t dim, std::vector<double>& out) {
  const double kInf = std::numeric_limits<double>::infinity();
  const int64_t keys = static_cast<int64_t>(scores.size());
  std::vector<double> acc(static_cast<size_t>(dim), 0.0);
  double total = 0.0, running = -kInf;
  for (int64_t start = 0; start < keys; start += kPVStep) {
    const int64_t end = std::min(keys, start + int64_t{kPVStep});
    double m = running;
    for (int64_t j = start; j < end; ++j) m = (scores[j] > m || std::isnan(scores[j])) ? scores[j] : m;
    if (m != running && running != -kInf) {  // (a NaN max makes the rescale NaN: the row is NaN)
      const double w = std::exp(running - m);
      total *= w;
      for (double& a : acc) a *= w;
    }
    running = m;
    if (m == -kInf) continue;  // every key so far masked: P is 0
    for (int64_t j = start; j < end; ++j) {
      const double p8 = std::nearbyint(255.0 * std::exp(scores[j] - m));
      if (p8 == 0.0) continue;
      total += p8;
      for (int64_t d = 0; d < dim; ++d) acc[d] += p8 * v8.values[j * dim + d];
    }
  }
  for (int64_t d = 0; d < dim; ++d) {
    out[d] = total == 0.0 ? 0.0 : static_cast<double>(v8.scale[d]) * acc[d] / total + v8.mean[d];
  }
}

}  // namespace

void reference(const AttentionParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  const int64_t dim = p.head_dim, group = p.heads_q / p.heads_kv;
  const bool int8 = p.precision != AttentionPrecision::kExact;
  const bool int8_pv = p.precision == AttentionPrecision::kInt8QKPV;
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
      const Int8Channels v8 = int8_pv ? quantize_int8_channels(v, p.seq_k, dim) : Int8Channels{};
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
          if (int8_pv) {
            int8_pv_row(scores, v8, dim, acc);
            total = 1.0;  // (normalized already)
          } else if (row_max != -std::numeric_limits<double>::infinity()) {  // else: every key masked, out 0
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

// Host-side tests of the attention reference: known values and validation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ltx_kernels/attention.h"
#include "ops/attention_workspace.h"

namespace ltx_kernels {
namespace {

// One batch, one head, contiguous [S, D] q, k, v and out.
AttentionParams params(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                       std::vector<float>& out, int64_t dim) {
  AttentionParams p;
  p.batch = p.heads_q = p.heads_kv = 1;
  p.head_dim = dim;
  p.seq_q = static_cast<int64_t>(q.size()) / dim;
  p.seq_k = static_cast<int64_t>(k.size()) / dim;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = out.data();
  p.q_strides = {p.seq_q * dim, p.seq_q * dim, dim};
  p.k_strides = p.v_strides = {p.seq_k * dim, p.seq_k * dim, dim};
  p.out_strides = p.q_strides;
  return p;
}

TEST(AttentionReference, KnownValuesAndMasks) {
  // Two keys with scores 0 and log(3) (scale 1): weights 1/4 and 3/4.
  const std::vector<float> q = {1.0f, 0.0f}, k = {0.0f, 0.0f, std::log(3.0f), 0.0f};
  const std::vector<float> v = {4.0f, 8.0f, 0.0f, 4.0f};
  std::vector<float> out(2);
  AttentionParams p = params(q, k, v, out, 2);
  reference(p);
  EXPECT_NEAR(out[0], 1.0f, 1e-6);
  EXPECT_NEAR(out[1], 5.0f, 1e-6);
  // Masking the second key leaves the first's value; masking both gives zeros, not NaN.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> mask = {0.0f, -inf};
  p.mask = mask.data();
  p.mask_strides = {2, 2, 2};
  reference(p);
  EXPECT_EQ(out[0], 4.0f);
  mask[0] = -inf;
  reference(p);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(AttentionReference, Int8KeySmoothingKeepsAConstantKeyOffsetExact) {
  // Keys that differ only by a shared offset give uniform weights with or without 8 bits:
  // smoothing removes the offset before quantization.
  const std::vector<float> q = {0.5f, -1.0f}, k = {100.0f, 100.0f, 100.0f, 100.0f};
  const std::vector<float> v = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> out(2);
  AttentionParams p = params(q, k, v, out, 2);
  p.precision = AttentionPrecision::kInt8QK;
  reference(p);
  EXPECT_NEAR(out[0], 2.0f, 1e-6);
  EXPECT_NEAR(out[1], 3.0f, 1e-6);
}

TEST(AttentionValidate, RejectsBadParams) {
  AttentionParams p;
  p.batch = p.seq_q = p.seq_k = 1;
  p.heads_q = 3;
  p.heads_kv = 2;
  p.head_dim = 4;
  EXPECT_STREQ(validate(p), "heads_q must be a multiple of heads_kv");
  p.heads_q = 2;
  EXPECT_STREQ(validate(p), "q and out must not be null");
  p.precision = static_cast<AttentionPrecision>(5);
  EXPECT_STREQ(validate(p), "unknown precision");
}

// Exact attention over at most kShortMaxKeys keys (a text cross-attention) takes the short-key
// kernel on every GPU, with no workspace; more keys, no keys or the 8-bit method take the
// key-walking kernels.
TEST(AttentionPlan, ShortKeyKernelTakesExactAttentionOverAtMost128Keys) {
  AttentionParams p;
  p.batch = p.heads_q = p.heads_kv = 2;
  p.seq_q = 8064;
  p.head_dim = 64;
  p.dtype = DType::kBFloat16;
  p.arch = 90;
  for (int64_t keys : {1, 77, 128}) {
    p.seq_k = keys;
    EXPECT_TRUE(uses_short_kernel(p)) << keys;
    EXPECT_FALSE(uses_hopper_kernel(p)) << keys;
    EXPECT_EQ(workspace_bytes(p), 0) << keys;
  }
  for (int64_t keys : {0, 129, 8064}) {
    p.seq_k = keys;
    EXPECT_FALSE(uses_short_kernel(p)) << keys;
    EXPECT_EQ(workspace_bytes(p), 0) << keys;  // exact attention reads q, k and v in place
  }
  p.seq_k = 128;
  p.precision = AttentionPrecision::kInt8QK;
  EXPECT_FALSE(uses_short_kernel(p));
  EXPECT_GT(workspace_bytes(p), 0);  // its INT8 q and k
}

TEST(AttentionPlan, DecodeKernelTakesFewRowsPerKvHeadAgainstManyKeys) {
  AttentionParams p;
  p.batch = 2;
  p.heads_q = 32;
  p.heads_kv = 8;  // groups of 4 query heads
  p.head_dim = 128;
  p.dtype = DType::kBFloat16;
  p.arch = 90;
  p.seq_q = 1;
  p.seq_k = 8193;
  EXPECT_TRUE(uses_decode_kernel(p));
  EXPECT_FALSE(uses_hopper_kernel(p));
  const AttentionWorkspace w = attention_workspace(p, nullptr);
  EXPECT_EQ(w.decode_chunks, 129);  // 8193 keys in chunks of 64
  EXPECT_GE(w.bytes, 2 * 8 * 129 * kDecodeMaxRows * (128 + 2) * 4);
  p.seq_q = 4;  // 16 rows per kv head: the most it takes
  EXPECT_TRUE(uses_decode_kernel(p));
  p.seq_q = 5;
  EXPECT_FALSE(uses_decode_kernel(p));
  p.seq_q = 1;
  p.seq_k = kDecodeMinKeys - 1;
  EXPECT_FALSE(uses_decode_kernel(p));
  p.seq_k = 8193;
  p.precision = AttentionPrecision::kInt8QK;
  EXPECT_FALSE(uses_decode_kernel(p));
}

}  // namespace
}  // namespace ltx_kernels

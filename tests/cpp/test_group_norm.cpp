// Host-side tests of group_norm: the CPU reference against values worked out by hand, both
// layouts agreeing, and validation.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ltx_kernels/group_norm.h"

namespace ltx_kernels {
namespace {

// One sample, 4 channels in 2 groups, 2 positions, channels first: x[c][s].
GroupNormParams params(const std::vector<float>& x, std::vector<float>& out) {
  GroupNormParams p;
  p.batch = 1;
  p.channels = 4;
  p.spatial = 2;
  p.groups = 2;
  p.eps = 0.0f;
  p.x = x.data();
  p.out = out.data();
  return p;
}

TEST(GroupNormReference, NormalizesEachGroupWithAffineAddAndSilu) {
  // Group 0 = channels 0, 1: values 1, 3 | 5, 7 -> mean 4, var 5; group 1: 0, 0 | 2, 2 -> mean 1, var 1.
  const std::vector<float> x = {1, 3, 5, 7, 0, 0, 2, 2};
  std::vector<float> out(8);
  GroupNormParams p = params(x, out);
  reference(p);
  const double r5 = 1.0 / std::sqrt(5.0);
  EXPECT_NEAR(out[0], -3 * r5, 1e-6);
  EXPECT_NEAR(out[3], 3 * r5, 1e-6);
  EXPECT_NEAR(out[4], -1.0, 1e-6);
  EXPECT_NEAR(out[7], 1.0, 1e-6);

  // add shifts a channel before the norm: channel 2 by +2 makes group 1 = 2, 2 | 2, 2 (var 0).
  const std::vector<float> add = {0, 0, 2, 0};
  const std::vector<float> weight = {1, 1, 3, 1}, bias = {0, 0, 0.5f, 0};
  p.add = add.data();
  p.weight = weight.data();
  p.bias = bias.data();
  p.eps = 1.0f;
  p.silu = true;
  reference(p);
  const double y = 0.5;  // (h - mean) = 0 everywhere in group 1, times 3, plus 0.5
  EXPECT_NEAR(out[4], y / (1.0 + std::exp(-y)), 1e-6);
  const double z = -3 / std::sqrt(5.0 + 1.0);
  EXPECT_NEAR(out[0], z / (1.0 + std::exp(-z)), 1e-6);
}

TEST(GroupNormReference, ChannelsLastGivesTheSameValues) {
  const std::vector<float> first = {1, 3, 5, 7, 0, 0, 2, 2};
  std::vector<float> last(8), out_first(8), out_last(8);
  for (int c = 0; c < 4; ++c)
    for (int s = 0; s < 2; ++s) last[s * 4 + c] = first[c * 2 + s];
  reference(params(first, out_first));
  GroupNormParams p = params(last, out_last);
  p.channels_last = true;
  reference(p);
  for (int c = 0; c < 4; ++c)
    for (int s = 0; s < 2; ++s) EXPECT_EQ(out_last[s * 4 + c], out_first[c * 2 + s]);
}

TEST(GroupNormValidate, RejectsBadParams) {
  const std::vector<float> x(8);
  std::vector<float> out(8);
  GroupNormParams p = params(x, out);
  EXPECT_EQ(validate(p), nullptr);
  p.groups = 3;
  EXPECT_STREQ(validate(p), "channels must be a multiple of groups");
  p.groups = 0;
  EXPECT_STREQ(validate(p), "groups must be >= 1");
  p = params(x, out);
  p.eps = -1.0f;
  EXPECT_STREQ(validate(p), "eps must be >= 0");
  p = params(x, out);
  p.dtype = DType::kBFloat16;
  p.weight_dtype = DType::kFloat16;
  EXPECT_STREQ(validate(p), "weight_dtype must be dtype or float32");
  p = params(x, out);
  p.out = nullptr;
  EXPECT_STREQ(validate(p), "out is null");
  p.spatial = 0;  // no element: nothing to write
  EXPECT_EQ(validate(p), nullptr);
}

}  // namespace
}  // namespace ltx_kernels

// Host-side tests of the RoPE family: CPU reference vs known values, validation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ltx_kernels/rope.h"

namespace ltx_kernels {
namespace {

TEST(RopeReference, HalfSplitAndInterleavedPairs) {
  // One token, one head of 4 channels, rotary dims 4, all angles pi/2: cos 0, sin 1.
  const std::vector<float> x = {1, 2, 3, 4};
  const std::vector<float> cos = {0, 0, 0, 0};
  const std::vector<float> sin = {1, 1, 1, 1};
  std::vector<float> out(4);
  RopeParams p;
  p.batches = p.tokens = 1;
  p.head_dim = 4;
  p.sections[0] = 4;
  p.q.in = x.data();
  p.q.out = out.data();
  p.q.heads = 1;
  p.cos = cos.data();
  p.sin = sin.data();
  reference(p);  // rotate_half: (-x2, x1)
  EXPECT_EQ(out, (std::vector<float>{-3, -4, 1, 2}));
  p.interleaved = true;
  reference(p);  // pairs (0, 1), (2, 3)
  EXPECT_EQ(out, (std::vector<float>{-2, 1, -4, 3}));
}

TEST(LtxRopeReference, IdentityChannelsAndAngles) {
  // D = 8: 2 identity channels, K = 1 frequency (pi / 2) over 3 axes = channels 2..7.
  std::vector<float> x(8);
  for (int c = 0; c < 8; ++c) x[c] = static_cast<float>(c + 1);
  std::vector<float> out(8);
  LtxRopeParams p;
  p.batches = 1;
  p.tokens = 1;
  p.cols = 8;
  p.q = x.data();
  p.q_row_stride = 8;
  p.q_out = out.data();
  p.grid[0] = p.grid[1] = p.grid[2] = 1;
  // Token 0 is the grid point (0, 0, 0): g = 0, angle = (pi / 2) * (2 * 0 - 1) = -pi / 2.
  reference(p);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  // cos 0, sin -1: out[2i] = x[2i+1], out[2i+1] = -x[2i].
  EXPECT_NEAR(out[2], 4.0f, 1e-6);
  EXPECT_NEAR(out[3], -3.0f, 1e-6);
  EXPECT_NEAR(out[6], 8.0f, 1e-6);
  EXPECT_NEAR(out[7], -7.0f, 1e-6);
}

TEST(RopeValidate, RejectsBadParams) {
  RopeParams p;
  p.batches = p.tokens = 1;
  p.head_dim = 4;
  p.sections[0] = 6;
  EXPECT_STREQ(validate(p), "rotary dims exceed head_dim");
  p.sections[0] = 3;
  EXPECT_STREQ(validate(p), "rotary sections must be even and >= 0");
  LtxRopeParams l;
  l.batches = 1;
  l.tokens = 5;
  l.cols = 8;
  l.grid[0] = 2;
  l.grid[1] = 1;
  l.grid[2] = 2;
  EXPECT_STREQ(validate(l), "grid must hold exactly tokens points");
  l.norm = false;
  l.grid[2] = 3;
  l.tokens = 6;
  int w = 0;
  l.q_weight = &w;
  EXPECT_STREQ(validate(l), "norm weights need norm");
}

}  // namespace
}  // namespace ltx_kernels

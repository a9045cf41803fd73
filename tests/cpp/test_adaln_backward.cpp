// The AdaLN RMS norm backward's host logic and C++ reference: validate() names each bad param,
// and the reference matches the formula in double on a gated row with weight, gate and a
// per-batch scale (fp32, so that only the summation order differs).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ltx_kernels/adaln_backward.h"

namespace ltx_kernels {
namespace {

std::string message(const AdalnBackwardParams& p) {
  const ValidationError error = validate(p);
  return error ? error : "";
}

AdalnBackwardParams plain(int64_t rows, int64_t cols) {
  AdalnBackwardParams p;
  p.rows = rows;
  p.cols = cols;
  p.tokens = rows;
  p.x = reinterpret_cast<const void*>(0x1000);
  p.grad_out = reinterpret_cast<const void*>(0x2000);
  p.scale.ptr = reinterpret_cast<const void*>(0x3000);
  p.dx = reinterpret_cast<void*>(0x4000);
  p.gn = reinterpret_cast<float*>(0x5000);
  p.x_row_stride = p.grad_out_row_stride = p.dx_row_stride = cols;
  return p;
}

TEST(AdalnBackwardValidate, NamesEachBadParam) {
  EXPECT_EQ(message(plain(4, 64)), "");
  AdalnBackwardParams p = plain(4, 64);
  p.tokens = 3;
  EXPECT_EQ(message(p), "rows must be a multiple of tokens (>= 1)");
  p = plain(4, 64);
  p.gate.ptr = reinterpret_cast<const void*>(0x6000);
  EXPECT_EQ(message(p), "gate needs y (the gated form)");
  p = plain(4, 64);
  p.y = reinterpret_cast<const void*>(0x6000);
  EXPECT_EQ(message(p), "y, grad_h and dy go together (the gated form)");
  p = plain(4, 64);
  p.weight = reinterpret_cast<const float*>(0x6000);
  EXPECT_EQ(message(p), "weight and dw go together");
  p = plain(4, 64);
  p.scale.ptr = nullptr;
  EXPECT_EQ(message(p), "scale is null");
  p = plain(4, 64);
  p.eps = -1.0f;
  EXPECT_EQ(message(p), "eps must be >= 0");
  p = plain(4, 64);
  p.dx_row_stride = 63;
  EXPECT_EQ(message(p), "dx rows overlap (dx_row_stride < cols)");
}

TEST(AdalnBackwardReference, GatedRowMatchesTheFormulaInDouble) {
  constexpr int64_t kRows = 4, kCols = 37, kTokens = 2;  // two batches of two rows
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (float& e : v) e = normal(rng);
    return v;
  };
  const size_t n = kRows * kCols;
  const std::vector<float> x = randn(n), y = randn(n), g = randn(n), gh = randn(n);
  const std::vector<float> gate = randn(2 * kCols), scale = randn(2 * kCols), weight = randn(kCols);
  std::vector<float> dx(n), dy(n), gn(n), dw(n), dg(n);
  AdalnBackwardParams p = plain(kRows, kCols);
  p.tokens = kTokens;
  p.eps = 1e-6f;
  p.x = x.data();
  p.y = y.data();
  p.grad_out = g.data();
  p.grad_h = gh.data();
  p.y_row_stride = p.grad_h_row_stride = p.dy_row_stride = kCols;
  p.gate = {gate.data(), kCols, 0};
  p.scale = {scale.data(), kCols, 0};
  p.weight = weight.data();
  p.dx = dx.data();
  p.dy = dy.data();
  p.gn = gn.data();
  p.dw = dw.data();
  p.dg = dg.data();
  reference(p);
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t b = r / kTokens;
    std::vector<double> h(kCols);
    double sum_sq = 0.0;
    for (int64_t c = 0; c < kCols; ++c) {
      h[c] = static_cast<double>(x[r * kCols + c]) + static_cast<double>(y[r * kCols + c]) * gate[b * kCols + c];
      sum_sq += h[c] * h[c];
    }
    const double rstd = 1.0 / std::sqrt(sum_sq / kCols + 1e-6);
    double dot = 0.0;
    for (int64_t c = 0; c < kCols; ++c) {
      dot += g[r * kCols + c] * (1.0 + scale[b * kCols + c]) * weight[c] * h[c] * rstd;
    }
    for (int64_t c = 0; c < kCols; ++c) {
      const int64_t i = r * kCols + c;
      const double xhat = h[c] * rstd, dn = g[i] * (1.0 + scale[b * kCols + c]);
      const double d = rstd * (dn * weight[c] - xhat * dot / kCols) + gh[i];
      EXPECT_NEAR(dx[i], d, 1e-4 * (1.0 + std::fabs(d))) << r << "," << c;
      EXPECT_NEAR(dy[i], d * gate[b * kCols + c], 1e-4 * (1.0 + std::fabs(d * gate[b * kCols + c])));
      EXPECT_NEAR(gn[i], g[i] * xhat * weight[c], 1e-5 * (1.0 + std::fabs(g[i] * xhat * weight[c])));
      EXPECT_NEAR(dw[i], dn * xhat, 1e-5 * (1.0 + std::fabs(dn * xhat)));
      EXPECT_NEAR(dg[i], d * y[i], 1e-4 * (1.0 + std::fabs(d * y[i])));
    }
  }
}

}  // namespace
}  // namespace ltx_kernels

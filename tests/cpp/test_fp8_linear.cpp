// Host-side tests of the FP8 linear's reference: every e4m3 code decoded, the epilogue's
// order (scales, then bias, one rounding) and strided rows against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ltx_kernels/fp8_linear.h"
#include "reference/convert.h"

namespace ltx_kernels {
namespace {

// The e4m3 codes of exactly representable values.
std::vector<uint8_t> e4m3(const std::vector<float>& values) {
  std::vector<uint8_t> codes;
  for (float v : values) codes.push_back(host::float_to_e4m3(v));
  return codes;
}

// An fp32-output linear over [m, k] a and [n, k] b (row strides as given), with scales and bias.
Fp8LinearParams float_linear(int64_t m, int64_t n, int64_t k, const std::vector<uint8_t>& a, int64_t a_row_stride,
                             const std::vector<uint8_t>& b, const std::vector<float>& a_scale,
                             const std::vector<float>& b_scale, const std::vector<float>& bias,
                             std::vector<float>& out, int64_t out_row_stride) {
  Fp8LinearParams p;
  p.out_dtype = DType::kFloat32;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = a.data();
  p.a_row_stride = a_row_stride;
  p.b = b.data();
  p.b_row_stride = k;
  p.a_scale = a_scale.data();
  p.b_scale = b_scale.data();
  p.bias = bias.data();
  p.out = out.data();
  p.out_row_stride = out_row_stride;
  return p;
}

TEST(Fp8LinearReference, EveryCodeTimesOneIsItsValue) {
  const uint8_t one = host::float_to_e4m3(1.0f);
  const float unit = 1.0f;
  for (int code = 0; code < 256; ++code) {
    const uint8_t a = static_cast<uint8_t>(code);
    float out = -1.0f;
    Fp8LinearParams p;
    p.out_dtype = DType::kFloat32;
    p.m = p.n = p.k = 1;
    p.a = &a;
    p.b = &one;
    p.a_scale = p.b_scale = &unit;
    p.out = &out;
    p.out_row_stride = 1;
    ASSERT_EQ(validate(p), nullptr);
    reference(p);
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(out)) << code;
    } else if (out != 0.0f) {
      EXPECT_EQ(host::float_to_e4m3(out), code) << out;
    }
  }
}

TEST(Fp8LinearReference, ScalesBiasAndStridedRows) {
  // a = [[1, 2, pad], [-0.5, 4, pad]] (row stride 3), b = [[1, 1], [2, -1], [0.25, 0.5]]
  const std::vector<uint8_t> a = e4m3({1, 2, 0, -0.5f, 4, 0}), b = e4m3({1, 1, 2, -1, 0.25f, 0.5f});
  const std::vector<float> a_scale = {2.0f, 0.5f}, b_scale = {1.0f, 3.0f, -1.0f}, bias = {0.0f, 1.0f, -2.0f};
  std::vector<float> out(2 * 4, -7.0f);  // row stride 4: the last column stays untouched
  const Fp8LinearParams p = float_linear(2, 3, 2, a, 3, b, a_scale, b_scale, bias, out, 4);
  ASSERT_EQ(validate(p), nullptr);
  reference(p);
  // acc row 0: [3, 0, 1.25]; row 1: [3.5, -5, 1.875]
  const std::vector<float> expected = {6.0f, 1.0f, -4.5f, -7.0f, 1.75f, -6.5f, -2.9375f, -7.0f};
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], expected[i]) << i;
}

TEST(Fp8LinearReference, RoundsOnceToTheOutputDtype) {
  // 1 + 2^-9 (exact in fp32) is a quarter of bf16's step above 1: the output rounds to 1.
  const uint8_t a[2] = {host::float_to_e4m3(1.0f), host::float_to_e4m3(0.001953125f)};
  const uint8_t b[2] = {host::float_to_e4m3(1.0f), host::float_to_e4m3(1.0f)};
  const float unit = 1.0f;
  uint16_t out = 0;
  Fp8LinearParams p;
  p.out_dtype = DType::kBFloat16;
  p.m = p.n = 1;
  p.k = 2;
  p.a = a;
  p.a_row_stride = 2;
  p.b = b;
  p.b_row_stride = 2;
  p.a_scale = p.b_scale = &unit;
  p.out = &out;
  p.out_row_stride = 1;
  reference(p);
  EXPECT_EQ(host::bf16_to_float(out), 1.0f);
}

TEST(Fp8LinearReference, GatedResidualPerBatchOfRows) {
  // 4 rows in 2 batches of 2 rows, n = 2, k = 1: acc = a * b; out = residual + gate[batch] * y,
  // y = acc * a_scale * b_scale + bias, in fp32, rounded once.
  const std::vector<uint8_t> a = e4m3({1, 2, -1, 0.5f}), b = e4m3({1, -2});
  const std::vector<float> a_scale = {1, 1, 2, 4}, b_scale = {1, 0.5f}, bias = {1, 0};
  // gate rows 3 apart (a strided view): batch 0 = [2, -1], batch 1 = [0.5, 10]
  const std::vector<float> gate = {2, -1, 99, 0.5f, 10, 99};
  const std::vector<float> residual = {1, 1, 2, 2, 3, 3, 4, 4};
  std::vector<float> out(8, -7.0f);
  Fp8LinearParams p = float_linear(4, 2, 1, a, 1, b, a_scale, b_scale, bias, out, 2);
  p.residual = residual.data();
  p.residual_row_stride = 2;
  p.gate = gate.data();
  p.gate_batch_stride = 3;
  p.batch_rows = 2;
  ASSERT_EQ(validate(p), nullptr);
  reference(p);
  // y rows: [2, -1], [3, -2], [-1, 2], [3, -2]
  const std::vector<float> expected = {5, 2, 8, 4, 2.5f, 23, 5.5f, -16};
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], expected[i]) << i;

  p.batch_rows = 3;  // does not divide m
  EXPECT_NE(validate(p), nullptr);
  p.batch_rows = 2;

  // No gate: out = residual + y (a gate of ones).
  p.gate = nullptr;
  ASSERT_EQ(validate(p), nullptr);
  reference(p);
  const std::vector<float> ungated = {3, 0, 5, 0, 2, 5, 7, 2};
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], ungated[i]) << i;
  p.residual = nullptr;  // but no gate without a residual
  p.gate = gate.data();
  EXPECT_NE(validate(p), nullptr);
}

TEST(Fp8LinearReference, GeluTanhOfTheFp32Result) {
  // y = acc * a_scale * b_scale + bias in fp32, then gelu_tanh(y) = y / (1 + exp(-2u)),
  // u = sqrt(2 / pi) (y + 0.044715 y^3), rounded once (here to fp32).
  const std::vector<uint8_t> a = e4m3({1, -3}), b = e4m3({1.5f, 0.25f});
  const std::vector<float> a_scale = {1, 1}, b_scale = {1, 2}, bias = {0.5f, -1};
  std::vector<float> out(4, -7.0f);
  Fp8LinearParams p = float_linear(2, 2, 1, a, 1, b, a_scale, b_scale, bias, out, 2);
  p.activation = Fp8Activation::kGeluTanh;
  ASSERT_EQ(validate(p), nullptr);
  reference(p);
  const double y[4] = {2.0, -0.5, -4.0, -2.5};  // [1 * 1.5 + 0.5, 1 * 0.5 - 1], [-4.5 + 0.5, -1.5 - 1]
  for (int i = 0; i < 4; ++i) {
    const double u = std::sqrt(2.0 / M_PI) * (y[i] + 0.044715 * y[i] * y[i] * y[i]);
    EXPECT_FLOAT_EQ(out[i], static_cast<float>(y[i] / (1.0 + std::exp(-2.0 * u)))) << i;
  }
  EXPECT_LT(out[2], 0.0f);  // GELU of -4: small and negative, not 0 (no cancellation in 1 + tanh)

  p.residual = out.data();  // not with the gated residual
  p.gate = bias.data();
  p.residual_row_stride = 2;
  p.batch_rows = 1;
  EXPECT_NE(validate(p), nullptr);
  p.residual = nullptr;
  p.gate = nullptr;
  p.activation = static_cast<Fp8Activation>(7);
  EXPECT_NE(validate(p), nullptr);
}

TEST(Fp8LinearReference, ValidateNamesWhatIsWrong) {
  Fp8LinearParams p;
  p.m = p.n = p.k = 4;
  EXPECT_NE(validate(p), nullptr);  // null pointers
  p.m = -1;
  EXPECT_NE(validate(p), nullptr);
  Fp8LinearParams empty;
  EXPECT_EQ(validate(empty), nullptr);
}

}  // namespace
}  // namespace ltx_kernels

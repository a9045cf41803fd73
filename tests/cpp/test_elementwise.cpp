// Host-side tests of the elementwise family: CPU reference vs known values, validation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ltx_kernels/elementwise.h"

namespace ltx_kernels {
namespace {

ElementwiseParams params(ElementwiseOp op, const std::vector<float>& a, const std::vector<float>* b,
                         std::vector<float>& out) {
  ElementwiseParams p;
  p.op = op;
  p.rows = 1;
  p.cols = static_cast<int64_t>(a.size());
  p.a = a.data();
  p.a_row_stride = p.cols;
  if (b) {
    p.b = b->data();
    p.b_row_stride = p.cols;
  }
  p.out = out.data();
  p.out_row_stride = p.cols;
  return p;
}

TEST(ElementwiseReference, ActivationsKnownValues) {
  const std::vector<float> a = {-3.0f, 0.0f, 1.0f};
  const std::vector<float> b = {2.0f, 5.0f, -1.0f};
  std::vector<float> out(3);
  reference(params(ElementwiseOp::kSiluAndMul, a, &b, out));
  EXPECT_NEAR(out[0], -3.0 / (1.0 + std::exp(3.0)) * 2.0, 1e-6);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_NEAR(out[2], -1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  reference(params(ElementwiseOp::kGeluAndMul, a, &b, out));
  EXPECT_NEAR(out[2], -0.8413447460685429, 1e-6);  // gelu(1) = Phi(1)
  reference(params(ElementwiseOp::kGeluTanh, a, nullptr, out));
  EXPECT_NEAR(out[2], 0.8411919906082768, 1e-6);  // the tanh approximation at 1
}

// Far negative inputs, where 1 + tanh and 1 + erf cancel in double (tanh(-19) == -1): the
// reference keeps the tail, as the kernels do (x e^(2u), x Phi(x), x e^x).
TEST(ElementwiseReference, ActivationsKeepTheNegativeTail) {
  const std::vector<float> a = {-9.0f, -20.0f, -90.0f};
  const std::vector<float> ones = {1.0f, 1.0f, 1.0f};
  std::vector<float> out(3);
  const double k = std::sqrt(2.0 / M_PI);
  reference(params(ElementwiseOp::kGeluTanh, a, nullptr, out));
  const double u9 = k * (-9.0 + 0.044715 * -729.0);
  EXPECT_NEAR(out[0] / (-9.0 * std::exp(2.0 * u9)), 1.0, 1e-6);  // ~ -1.3e-28, not 0
  reference(params(ElementwiseOp::kGeluAndMul, a, &ones, out));
  EXPECT_NEAR(out[0] / (-4.5 * std::erfc(9.0 / std::sqrt(2.0))), 1.0, 1e-6);  // ~ -1e-18, not 0
  reference(params(ElementwiseOp::kSiluAndMul, a, &ones, out));
  EXPECT_NEAR(out[2] / (-90.0 * std::exp(-90.0)), 1.0, 1e-6);  // ~ -7.4e-38: a normal fp32
}

TEST(ElementwiseReference, GatedResidualBroadcastsThePerBatchGate) {
  // 2 batches x 2 tokens x 2 channels; gate [2, 1, 2].
  const std::vector<float> x = {1, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<float> y = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> gate = {10, 20, -1, -2};
  std::vector<float> out(8);
  ElementwiseParams p = params(ElementwiseOp::kGatedResidual, x, &y, out);
  p.rows = 4;
  p.cols = 2;
  p.a_row_stride = p.b_row_stride = p.out_row_stride = 2;
  p.tokens = 2;
  p.gate = {gate.data(), 2, 0};
  reference(p);
  const std::vector<float> want = {11, 41, 31, 81, -4, -11, -6, -15};
  EXPECT_EQ(out, want);
}

TEST(ElementwiseValidate, RejectsBadParams) {
  const std::vector<float> a = {1.0f};
  std::vector<float> out(1);
  ElementwiseParams p = params(ElementwiseOp::kSiluAndMul, a, nullptr, out);
  EXPECT_STREQ(validate(p), "b is null");
  p = params(ElementwiseOp::kGeluTanh, a, nullptr, out);
  p.gate.ptr = a.data();
  EXPECT_STREQ(validate(p), "gate is only defined for the gated residual");
  p = params(ElementwiseOp::kGeluTanh, a, nullptr, out);
  p.tokens = 2;
  EXPECT_STREQ(validate(p), "rows must be a multiple of tokens");
  p = params(ElementwiseOp::kGeluTanh, a, nullptr, out);
  p.rows = 0;
  p.a = nullptr;
  EXPECT_EQ(validate(p), nullptr);  // nothing to do
}

}  // namespace
}  // namespace ltx_kernels

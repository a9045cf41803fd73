// Host-side tests of FP8 quantization: the e4m3 rounding of the reference against every
// code, and the row semantics (scale, zero rows, NaN) against known values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ltx_kernels/quantize.h"
#include "reference/activation.h"
#include "reference/convert.h"

namespace ltx_kernels {
namespace {

TEST(QuantizeReference, EveryCodeRoundTripsAndTiesGoToEven) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    const float v = host::e4m3_to_float(static_cast<uint8_t>(code));
    if (v == 0.0f) continue;  // -0 and +0 compare equal
    EXPECT_EQ(host::float_to_e4m3(v), code) << v;
    // The midpoint to the next code up rounds to whichever of the two has an even mantissa.
    const int next = code + 1;
    if ((next & 0x7f) >= 0x7f) continue;
    const float mid = (v + host::e4m3_to_float(static_cast<uint8_t>(next))) / 2;
    EXPECT_EQ(host::float_to_e4m3(mid), (code & 1) ? next : code) << mid;
  }
  EXPECT_EQ(host::float_to_e4m3(152.0f), 0x72);  // 144 | 152 | 160 (0x72): even is 160
  EXPECT_EQ(host::float_to_e4m3(1e6f), 0x7e);    // saturates to 448
  EXPECT_EQ(host::float_to_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(host::float_to_e4m3(std::nanf("")), 0x7f);
}

TEST(QuantizeReference, RowScalesZeroRowsAndNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 0.0f, 0.0f, 0.0f, 3.0f, nan, 1.0f};
  std::vector<uint8_t> out(9);
  std::vector<float> scale(3);
  QuantizeParams p;
  p.rows = 3;
  p.cols = 3;
  p.x = x.data();
  p.x_row_stride = 3;
  p.out = out.data();
  p.out_row_stride = 3;
  p.scale = scale.data();
  reference(p);
  EXPECT_EQ(scale[0], 2.0f / 448.0f);
  EXPECT_EQ(host::e4m3_to_float(out[1]), -448.0f);
  EXPECT_EQ(host::e4m3_to_float(out[0]), 224.0f);
  EXPECT_EQ(scale[1], kMinAmax / 448.0f);
  EXPECT_EQ(out[3], 0);
  EXPECT_TRUE(std::isnan(scale[2]));
  EXPECT_EQ(out[6], 0x7f);
}

TEST(QuantizeReference, GeluTanhIsAppliedBeforeTheScale) {
  const std::vector<float> x = {1.0f, -1.0f, 2.0f};
  std::vector<uint8_t> out(3);
  float scale = 0.0f;
  QuantizeParams p;
  p.activation = Fp8Activation::kGeluTanh;
  p.rows = 1;
  p.cols = 3;
  p.x = x.data();
  p.out = out.data();
  p.out_row_stride = 3;
  p.scale = &scale;
  reference(p);
  const float gelu2 = static_cast<float>(host::gelu_tanh(2.0));
  EXPECT_EQ(scale, gelu2 / 448.0f);
  EXPECT_EQ(host::e4m3_to_float(out[2]), 448.0f);
  EXPECT_LT(host::e4m3_to_float(out[1]), 0.0f);  // gelu(-1) = -0.159
}

TEST(QuantizeValidate, RejectsBadParams) {
  QuantizeParams p;
  p.rows = 2;
  p.cols = 4;
  EXPECT_STREQ(validate(p), "scale is null");
  float scale[2];
  p.scale = scale;
  EXPECT_STREQ(validate(p), "x is null");
  p.rows = -1;
  EXPECT_STREQ(validate(p), "rows must be >= 0");
  p.rows = 2;
  p.activation = static_cast<Fp8Activation>(7);
  EXPECT_STREQ(validate(p), "unknown activation");
}

}  // namespace
}  // namespace ltx_kernels

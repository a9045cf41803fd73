// Host-side tests of the norm family: CPU reference vs known values, validation, planning.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ltx_kernels/norm.h"
#include "reference/convert.h"

namespace ltx_kernels {
namespace {

NormParams rows_params(NormType type, const std::vector<float>& x, std::vector<float>& out,
                       int64_t rows, int64_t cols) {
  NormParams p;
  p.type = type;
  p.dtype = DType::kFloat32;
  p.rows = rows;
  p.cols = cols;
  p.x = x.data();
  p.x_row_stride = cols;
  p.out = out.data();
  p.out_row_stride = cols;
  return p;
}

TEST(NormReference, RmsNormKnownValues) {
  // mean(x^2) of [1, 2, 3, 4] is 7.5.
  const std::vector<float> x = {1, 2, 3, 4};
  const std::vector<float> w = {1, 2, 0.5f, -1};
  std::vector<float> out(4);
  NormParams p = rows_params(NormType::kRms, x, out, 1, 4);
  p.eps = 0.0f;
  p.weight = w.data();
  reference(p);
  const double r = 1.0 / std::sqrt(7.5);
  EXPECT_NEAR(out[0], 1 * r * 1, 1e-6);
  EXPECT_NEAR(out[1], 2 * r * 2, 1e-6);
  EXPECT_NEAR(out[2], 3 * r * 0.5, 1e-6);
  EXPECT_NEAR(out[3], 4 * r * -1, 1e-6);
}

TEST(NormReference, GemmaOffsetAndEps) {
  const std::vector<float> x = {3, 4};
  const std::vector<float> w = {0, 1};
  std::vector<float> out(2);
  NormParams p = rows_params(NormType::kRms, x, out, 1, 2);
  p.eps = 0.5f;  // mean(x^2) = 12.5 -> rsqrt(13)
  p.weight = w.data();
  p.weight_offset = 1.0f;
  reference(p);
  EXPECT_NEAR(out[0], 3 / std::sqrt(13.0) * 1, 1e-6);
  EXPECT_NEAR(out[1], 4 / std::sqrt(13.0) * 2, 1e-6);
}

TEST(NormReference, LayerNormKnownValuesWithStridedRows) {
  // Two rows of 3 inside rows of 5: the last two columns must be ignored.
  const std::vector<float> x = {1, 2, 3, 99, 99, 10, 10, 13, 99, 99};
  const std::vector<float> bias = {1, 1, 1};
  std::vector<float> out(6, NAN);
  NormParams p = rows_params(NormType::kLayer, x, out, 2, 3);
  p.x_row_stride = 5;
  p.eps = 0.0f;
  p.bias = bias.data();
  reference(p);
  const double s = std::sqrt(2.0 / 3.0);  // row 0: mean 2, var 2/3
  EXPECT_NEAR(out[0], -1 / s + 1, 1e-6);
  EXPECT_NEAR(out[1], 1, 1e-6);
  EXPECT_NEAR(out[2], 1 / s + 1, 1e-6);
  EXPECT_NEAR(out[3], -1 / std::sqrt(2.0) + 1, 1e-6);  // row 1: mean 11, var 2
  EXPECT_NEAR(out[5], 2 / std::sqrt(2.0) + 1, 1e-6);
}

TEST(NormReference, FusedAddRoundsResidualToDtypeInPlace) {
  using host::float_to_bf16;
  // 1 + 2^-9 is not a bf16: the new residual rounds to 1, and the norm uses that.
  std::vector<uint16_t> x = {float_to_bf16(1.0f), float_to_bf16(2.0f)};
  std::vector<uint16_t> residual = {float_to_bf16(0.001953125f), float_to_bf16(0.0f)};
  std::vector<uint16_t> out(2);
  NormParams p;
  p.dtype = p.weight_dtype = p.out_dtype = DType::kBFloat16;
  p.rows = 1;
  p.cols = 2;
  p.eps = 0.0f;
  p.x = x.data();
  p.residual = residual.data();
  p.new_residual = residual.data();  // in place
  p.out = out.data();
  p.x_row_stride = p.residual_row_stride = p.new_residual_row_stride = p.out_row_stride = 2;
  reference(p);
  EXPECT_EQ(host::bf16_to_float(residual[0]), 1.0f);
  EXPECT_EQ(host::bf16_to_float(residual[1]), 2.0f);
  const double r = 1.0 / std::sqrt(2.5);
  EXPECT_NEAR(host::bf16_to_float(out[0]), r, 4e-3);
  EXPECT_NEAR(host::bf16_to_float(out[1]), 2 * r, 8e-3);
}

TEST(NormReference, MixedPrecisionReadsFloatWeightsAndWritesFloatOut) {
  using host::float_to_bf16;
  // x in bf16, weight and bias in fp32 with more bits than bf16 holds, out in fp32: the
  // weight is read whole and the output is not rounded to bf16.
  const std::vector<uint16_t> x = {float_to_bf16(1.0f), float_to_bf16(-1.0f)};
  const std::vector<float> weight = {1.0f + 1e-4f, 3.0f}, bias = {1e-4f, 0.0f};
  std::vector<float> out(2);
  NormParams p;
  p.type = NormType::kLayer;
  p.dtype = DType::kBFloat16;
  p.weight_dtype = p.out_dtype = DType::kFloat32;
  p.rows = 1;
  p.cols = 2;
  p.eps = 0.0f;
  p.x = x.data();
  p.weight = weight.data();
  p.bias = bias.data();
  p.out = out.data();
  p.x_row_stride = p.out_row_stride = 2;
  reference(p);
  EXPECT_FLOAT_EQ(out[0], (1.0f + 1e-4f) + 1e-4f);  // xhat = +-1
  EXPECT_EQ(out[1], -3.0f);
  // The same with out in bf16: rounded once.
  std::vector<uint16_t> out16(2);
  p.out = out16.data();
  p.out_dtype = DType::kBFloat16;
  reference(p);
  EXPECT_EQ(out16[0], float_to_bf16(1.0f + 2e-4f));
  EXPECT_EQ(out16[1], float_to_bf16(-3.0f));
}

TEST(NormReference, GatedResidualAndModulationPerBatch) {
  // Two batches of one token each: row r uses gate/scale/shift row r (per batch).
  const std::vector<float> y = {1, 1, 2, 2};         // branch output
  const std::vector<float> x = {0, 0, 1, 1};         // residual stream
  const std::vector<float> gate = {2, 2, 0.5f, 0.5f};
  const std::vector<float> scale = {0, 0, 1, 1};
  const std::vector<float> shift = {0, 0, 10, 10};
  std::vector<float> out(4), x_new(4);
  NormParams p = rows_params(NormType::kRms, y, out, 2, 2);
  p.eps = 0.0f;
  p.residual = x.data();
  p.residual_row_stride = 2;
  p.new_residual = x_new.data();
  p.new_residual_row_stride = 2;
  p.tokens = 1;
  p.gate = {gate.data(), 2, 0};
  p.scale = {scale.data(), 2, 0};
  p.shift = {shift.data(), 2, 0};
  reference(p);
  EXPECT_EQ(x_new, (std::vector<float>{2, 2, 2, 2}));  // 0 + 1 * 2, 1 + 2 * 0.5
  // rms of [2, 2] is 2: normalized 1; row 0 unmodulated, row 1: 1 * (1 + 1) + 10.
  EXPECT_NEAR(out[0], 1.0, 1e-6);
  EXPECT_NEAR(out[3], 12.0, 1e-6);
}

TEST(NormReference, Fp8OutputQuantizesTheRoundedRow) {
  // rms of [3, 4] is sqrt(12.5): normalized [0.8485, 1.1314], then * (1 + 1) + 0.
  // amax 2.2627 -> scale amax / 448; the row's max maps to 448 exactly, the other to
  // 448 * 3 / 4 = 336 (an e4m3 value).
  const std::vector<float> x = {3, 4}, scale = {1, 1}, shift = {0, 0};
  std::vector<float> out(2);
  std::vector<uint8_t> q(2);
  float q_scale = 0;
  NormParams p = rows_params(NormType::kRms, x, out, 1, 2);
  p.eps = 0.0f;
  p.scale = {scale.data(), 0, 0};
  p.shift = {shift.data(), 0, 0};
  p.out_fp8 = q.data();
  p.out_fp8_row_stride = 2;
  p.out_fp8_scale = &q_scale;
  reference(p);
  const float amax = static_cast<float>(2.0 * 4.0 / std::sqrt(12.5));
  EXPECT_NEAR(out[1], amax, 1e-6);
  EXPECT_EQ(q_scale, out[1] / 448.0f);
  EXPECT_EQ(q[1], host::float_to_e4m3(448.0f));
  EXPECT_EQ(q[0], host::float_to_e4m3(out[0] * (448.0f / out[1])));
  EXPECT_EQ(q[0], host::float_to_e4m3(336.0f));
  // Without the dtype output: the same bytes and scale.
  std::vector<uint8_t> q_alone(2);
  float scale_alone = 0;
  p.out = nullptr;
  p.out_row_stride = 0;
  p.out_fp8 = q_alone.data();
  p.out_fp8_scale = &scale_alone;
  reference(p);
  EXPECT_EQ(q_alone, q);
  EXPECT_EQ(scale_alone, q_scale);
}

TEST(Convert, Bf16RoundsToNearestEven) {
  EXPECT_EQ(host::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(host::float_to_bf16(1.00390625f), 0x3f80);  // halfway, even stays
  EXPECT_EQ(host::float_to_bf16(1.01171875f), 0x3f82);  // halfway, odd rounds up
  EXPECT_TRUE(std::isnan(host::bf16_to_float(host::float_to_bf16(NAN))));
  EXPECT_EQ(host::round_to(65520.0f, DType::kFloat16), INFINITY);
  EXPECT_EQ(host::round_to(1.0f + 1e-4f, DType::kFloat16), 1.0f);
}

TEST(NormValidate, RejectsBadParams) {
  std::vector<float> x(8), out(8);
  NormParams p = rows_params(NormType::kRms, x, out, 2, 4);
  EXPECT_EQ(validate(p), nullptr);
  NormParams bad = p;
  bad.cols = 0;
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.out_row_stride = 3;
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.residual = x.data();  // without new_residual
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.bias = x.data();  // bias on an RMS norm
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.type = NormType::kLayer;  // a residual on a layer norm: the kernels have none
  bad.residual = x.data();
  bad.new_residual = out.data();
  bad.new_residual_row_stride = 4;
  EXPECT_NE(validate(bad), nullptr);
  bad.type = NormType::kRms;
  EXPECT_EQ(validate(bad), nullptr);
  bad = p;
  bad.eps = -1.0f;
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.eps = NAN;
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.scale.ptr = x.data();  // without shift
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.gate.ptr = x.data();  // without residual
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.tokens = 3;  // 2 rows are not a multiple of 3
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.out_fp8 = reinterpret_cast<uint8_t*>(out.data());  // without out_fp8_scale
  bad.out_fp8_row_stride = 4;
  EXPECT_NE(validate(bad), nullptr);
  bad.out_fp8_scale = out.data();
  EXPECT_EQ(validate(bad), nullptr);
  bad.out = nullptr;  // the FP8 output alone: out_row_stride must say so
  EXPECT_NE(validate(bad), nullptr);
  bad.out_row_stride = 0;
  EXPECT_EQ(validate(bad), nullptr);
  bad.out_fp8_row_stride = 3;
  EXPECT_NE(validate(bad), nullptr);
  bad = p;
  bad.x = nullptr;
  EXPECT_NE(validate(bad), nullptr);
  bad.rows = 0;  // nothing to read: null pointers are fine
  EXPECT_EQ(validate(bad), nullptr);
  // Mixed precision: weight / out in dtype or float32, a float32 out with a float32 weight,
  // neither with modulation or an FP8 output.
  bad = p;
  bad.dtype = bad.weight_dtype = bad.out_dtype = DType::kBFloat16;
  EXPECT_EQ(validate(bad), nullptr);
  bad.weight_dtype = DType::kFloat16;
  EXPECT_NE(validate(bad), nullptr);
  bad.weight_dtype = DType::kFloat32;
  EXPECT_EQ(validate(bad), nullptr);
  bad.out_dtype = DType::kFloat32;
  EXPECT_EQ(validate(bad), nullptr);
  bad.weight_dtype = DType::kBFloat16;
  EXPECT_NE(validate(bad), nullptr);
  bad.weight_dtype = DType::kFloat32;
  bad.scale.ptr = bad.shift.ptr = x.data();
  EXPECT_NE(validate(bad), nullptr);
}

NormParams plan_params(DType dtype, int64_t cols, uintptr_t x_addr = 0x1000,
                       int64_t stride = -1) {
  NormParams p;
  p.dtype = p.weight_dtype = p.out_dtype = dtype;
  p.rows = 1000;
  p.cols = cols;
  p.x = reinterpret_cast<const void*>(x_addr);
  p.out = reinterpret_cast<void*>(0x2000);
  p.x_row_stride = stride < 0 ? cols : stride;
  p.out_row_stride = cols;
  return p;
}

TEST(NormPlan, VectorizesOnlyWhenAligned) {
  EXPECT_EQ(plan_norm(plan_params(DType::kBFloat16, 2048)).vec, 8);
  EXPECT_EQ(plan_norm(plan_params(DType::kFloat32, 2048)).vec, 4);
  EXPECT_EQ(plan_norm(plan_params(DType::kBFloat16, 2047)).vec, 1);          // odd size
  EXPECT_EQ(plan_norm(plan_params(DType::kBFloat16, 2048, 0x1002)).vec, 1);  // misaligned
  EXPECT_EQ(plan_norm(plan_params(DType::kBFloat16, 2048, 0x1000, 2052)).vec, 1);
  EXPECT_EQ(plan_norm(plan_params(DType::kBFloat16, 2048, 0x1000, 6144)).vec, 8);
}

TEST(NormPlan, AdaLNWithoutResidualHoldsFourVectorsPerThread) {
  // adaln_rms_norm(_fp8), LTX D = 2048 bf16: 64 threads x 4 vectors a row, 4 rows a block,
  // with or without the FP8 output (the two forms must agree bit for bit: one plan).
  NormParams mod = plan_params(DType::kBFloat16, 2048);
  mod.scale.ptr = reinterpret_cast<const void*>(0x4000);
  for (bool fp8 : {false, true}) {
    mod.out_fp8 = fp8 ? reinterpret_cast<uint8_t*>(0x3000) : nullptr;
    const NormLaunchPlan plan = plan_norm(mod);
    EXPECT_EQ(plan.threads_per_row, 64);
    EXPECT_EQ(plan.items, 4);
    EXPECT_EQ(plan.rows_per_block, 4);
    EXPECT_EQ(plan.blocks, 250);
  }
  mod.cols = mod.x_row_stride = mod.out_row_stride = 3072;  // 384 vectors: 128 threads x 4 (3 used)
  EXPECT_EQ(plan_norm(mod).threads_per_row, 128);
  EXPECT_EQ(plan_norm(mod).items, 4);
  // With a residual (gated_residual_adaln_rms_norm): as the plain fused-add norm; without
  // modulation, the plan of the plain norm below. Each FP8 form shares its norm's plan.
  mod.cols = mod.x_row_stride = mod.out_row_stride = 2048;
  mod.residual = reinterpret_cast<const void*>(0x5000);
  EXPECT_EQ(plan_norm(mod).threads_per_row, 256);
  EXPECT_EQ(plan_norm(mod).items, 1);
  // The plain RMS norm and its FP8 form: 2 vectors a thread from 1000 rows on, else 1.
  NormParams plain = plan_params(DType::kBFloat16, 2048);
  for (bool fp8 : {false, true}) {
    plain.out_fp8 = fp8 ? reinterpret_cast<uint8_t*>(0x3000) : nullptr;
    plain.rows = 1000;
    EXPECT_EQ(plan_norm(plain).threads_per_row, 128);
    EXPECT_EQ(plan_norm(plain).items, 2);
    plain.rows = 999;
    EXPECT_EQ(plan_norm(plain).threads_per_row, 256);
    EXPECT_EQ(plan_norm(plain).items, 1);
  }
  // Layer norms (with or without the FP8 output), plain and AdaLN: 4 vectors a thread from 1000
  // rows on; fewer rows, AdaLN 1 vector a thread, plain 2.
  NormParams layer = plan_params(DType::kBFloat16, 2048);
  layer.type = NormType::kLayer;
  for (bool adaln : {false, true}) {
    for (bool fp8 : {false, true}) {
      layer.scale.ptr = adaln ? reinterpret_cast<const void*>(0x4000) : nullptr;
      layer.out_fp8 = fp8 ? reinterpret_cast<uint8_t*>(0x3000) : nullptr;
      layer.rows = 1000;
      EXPECT_EQ(plan_norm(layer).threads_per_row, 64);
      EXPECT_EQ(plan_norm(layer).items, 4);
      for (int64_t rows : {999, 1}) {
        layer.rows = rows;
        EXPECT_EQ(plan_norm(layer).threads_per_row, adaln ? 256 : 128);
        EXPECT_EQ(plan_norm(layer).items, adaln ? 1 : 2);
      }
    }
  }
}

TEST(NormPlan, ShortRowsShareAWarp) {
  // head_dim 64 / 128 in 16 bits (QK norms): 8 or 16 threads a row, 32 or 16 rows a block;
  // the FP8 and modulated forms take the same plan.
  const NormLaunchPlan d64 = plan_norm(plan_params(DType::kBFloat16, 64));
  EXPECT_EQ(d64.threads_per_row, 8);
  EXPECT_EQ(d64.items, 1);
  EXPECT_EQ(d64.rows_per_block, 32);
  EXPECT_EQ(d64.blocks, 32);  // ceil(1000 / 32)
  NormParams d128 = plan_params(DType::kFloat16, 128);
  EXPECT_EQ(plan_norm(d128).threads_per_row, 16);
  d128.scale.ptr = reinterpret_cast<const void*>(0x4000);
  d128.out_fp8 = reinterpret_cast<uint8_t*>(0x3000);
  EXPECT_EQ(plan_norm(d128).threads_per_row, 16);
  EXPECT_EQ(plan_norm(d128).items, 1);
  EXPECT_EQ(plan_norm(plan_params(DType::kBFloat16, 136)).threads_per_row, 32);  // 17 vectors
  EXPECT_EQ(plan_norm(plan_params(DType::kFloat32, 64)).threads_per_row, 16);    // 16 fp32 vectors
  EXPECT_EQ(plan_norm(plan_params(DType::kBFloat16, 66)).vec, 1);  // not vectorized: an element a thread
  EXPECT_EQ(plan_norm(plan_params(DType::kBFloat16, 66)).threads_per_row, 128);
}

TEST(NormPlan, CachesRowsInRegistersUpToTheLimit) {
  // LTX D = 2048 bf16, 1000 rows: two 16-byte vectors per thread, two rows per 256-thread block.
  const NormLaunchPlan ltx = plan_norm(plan_params(DType::kBFloat16, 2048));
  EXPECT_EQ(ltx.items, 2);
  EXPECT_EQ(ltx.threads_per_row, 128);
  EXPECT_EQ(ltx.rows_per_block, 2);
  EXPECT_EQ(ltx.blocks, 500);
  const NormLaunchPlan llm = plan_norm(plan_params(DType::kBFloat16, 4096));
  EXPECT_EQ(llm.items, 2);
  EXPECT_EQ(llm.threads_per_row, 256);
  const NormLaunchPlan tiny = plan_norm(plan_params(DType::kFloat32, 7));
  EXPECT_EQ(tiny.threads_per_row, 32);
  EXPECT_EQ(tiny.items, 1);
  EXPECT_EQ(tiny.rows_per_block, 8);
  EXPECT_EQ(tiny.blocks, 125);
  EXPECT_EQ(plan_norm(plan_params(DType::kBFloat16, 8192)).items, 4);
  const NormLaunchPlan largest = plan_norm(plan_params(DType::kBFloat16, 16384));
  EXPECT_EQ(largest.items, kMaxItems);
  EXPECT_EQ(largest.threads_per_row, kMaxCachedThreads);
  const NormLaunchPlan streamed = plan_norm(plan_params(DType::kBFloat16, 16392));
  EXPECT_EQ(streamed.items, 0);
  EXPECT_EQ(streamed.threads_per_row, kMaxStreamedThreads);
  EXPECT_EQ(streamed.rows_per_block, 1);
  // Every row is covered: threads * items * vec >= cols whenever the row is cached.
  for (int64_t cols = 1; cols <= 20000; cols += 37) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      const NormLaunchPlan plan = plan_norm(plan_params(dtype, cols));
      // 8 or 16 threads only where the launcher has those kernels: vectorized, one vector each.
      if (plan.threads_per_row < 32) {
        EXPECT_TRUE(plan.threads_per_row == 8 || plan.threads_per_row == 16) << cols;
        EXPECT_EQ(plan.items, 1) << cols;
        EXPECT_GT(plan.vec, 1) << cols;
      } else {
        EXPECT_EQ(plan.threads_per_row % 32, 0);
      }
      if (plan.items > 0) {
        EXPECT_GE(int64_t{plan.threads_per_row} * plan.items * plan.vec, cols) << cols;
        EXPECT_LE(plan.items, kMaxItems);
        EXPECT_LE(plan.threads_per_row, kMaxCachedThreads);
      }
    }
  }
}

}  // namespace
}  // namespace ltx_kernels

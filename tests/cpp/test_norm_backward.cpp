// The fused norm backward's host logic: validate() messages and the launch plan (which rows
// the kernel takes in registers, and how).
#include <gtest/gtest.h>

#include <string>

#include "ltx_kernels/norm_backward.h"
#include "ops/norm_backward_plan.h"

namespace ltx_kernels {
namespace {

// A valid RMS backward of rows x cols at 16-byte aligned fake addresses, contiguous rows.
NormBackwardParams backward_params(DType dtype, int64_t cols, int64_t rows = 4) {
  NormBackwardParams p;
  p.dtype = dtype;
  p.rows = rows;
  p.cols = cols;
  p.x = reinterpret_cast<const void*>(0x1000);
  p.grad_out = reinterpret_cast<const void*>(0x2000);
  p.out = reinterpret_cast<void*>(0x3000);
  p.x_row_stride = p.grad_out_row_stride = p.out_row_stride = cols;
  return p;
}

std::string message(const NormBackwardParams& p) {
  const ValidationError error = validate(p);
  return error ? error : "";
}

TEST(NormBackwardValidate, AcceptsTheFormsTheTorchLayerPasses) {
  EXPECT_EQ(message(backward_params(DType::kBFloat16, 2048)), "");
  NormBackwardParams add = backward_params(DType::kBFloat16, 2048);  // fused_add_rms_norm
  add.grad_new_residual = reinterpret_cast<const void*>(0x4000);
  EXPECT_EQ(message(add), "");
  NormBackwardParams layer = backward_params(DType::kFloat32, 7);  // layer norm, weight and bias
  layer.type = NormType::kLayer;
  layer.weight = reinterpret_cast<const float*>(0x6000);
  layer.dweight_partial = reinterpret_cast<float*>(0x7000);
  layer.dweight = reinterpret_cast<void*>(0x7800);
  layer.dbias_partial = reinterpret_cast<float*>(0x8000);
  layer.dbias = reinterpret_cast<void*>(0x8800);
  EXPECT_EQ(message(layer), "");
  NormBackwardParams half_weight = backward_params(DType::kBFloat16, 2048);  // a bf16 weight read as it is
  half_weight.weight = reinterpret_cast<const void*>(0x6000);
  half_weight.weight_dtype = DType::kBFloat16;
  half_weight.dweight_partial = reinterpret_cast<float*>(0x7000);
  half_weight.dweight = reinterpret_cast<void*>(0x7800);
  EXPECT_EQ(message(half_weight), "");
  EXPECT_EQ(message(backward_params(DType::kFloat16, 0, 0)), "");  // nothing to do: no pointers needed
}

TEST(NormBackwardValidate, RejectsBadParams) {
  NormBackwardParams p = backward_params(DType::kBFloat16, 64);
  p.type = NormType::kLayer;
  p.grad_new_residual = reinterpret_cast<const void*>(0x4000);
  EXPECT_EQ(message(p), "grad_new_residual is only defined for the RMS norm");
  p = backward_params(DType::kBFloat16, 64);
  p.dbias_partial = reinterpret_cast<float*>(0x8000);
  EXPECT_EQ(message(p), "a bias is only defined for layer norm");
  p = backward_params(DType::kBFloat16, 64);
  p.weight = reinterpret_cast<const float*>(0x6000);
  EXPECT_EQ(message(p), "weight, dweight_partial and dweight go together");
  p.dweight_partial = reinterpret_cast<float*>(0x7000);
  EXPECT_EQ(message(p), "weight, dweight_partial and dweight go together");  // dweight missing
  p.dweight = reinterpret_cast<void*>(0x7800);
  p.weight_dtype = DType::kFloat16;
  EXPECT_EQ(message(p), "weight_dtype must be dtype or float32");
  p = backward_params(DType::kFloat32, 64);
  p.type = NormType::kLayer;
  p.dbias_partial = reinterpret_cast<float*>(0x8000);
  EXPECT_EQ(message(p), "dbias_partial and dbias go together");
  p = backward_params(DType::kBFloat16, 64);
  p.eps = -1.0f;
  EXPECT_EQ(message(p), "eps must be >= 0");
  p = backward_params(DType::kBFloat16, 64);
  p.grad_out = nullptr;
  EXPECT_EQ(message(p), "grad_out is null");
  p = backward_params(DType::kBFloat16, 64);
  p.blocks = 0;
  EXPECT_EQ(message(p), "blocks must be >= 1");
  p = backward_params(DType::kBFloat16, 64);
  p.grad_out_row_stride = -1;
  EXPECT_EQ(message(p), "input row strides must be >= 0");
  p = backward_params(DType::kBFloat16, 64);
  p.out_row_stride = 63;
  EXPECT_EQ(message(p), "out rows overlap (out_row_stride < cols)");
}

TEST(NormBackwardPlan, AWarpARowUpTo64VectorsThenTheBlockUpTo2048) {
  // bf16, 8 elements a vector: D 256 -> 32 vectors (a warp, 1 each), 512 -> 64 (a warp, 2 each),
  // 520 -> 65 (256 threads, 1 each), 4096 -> 512 (2 each), 16384 -> 2048 (8 each), past it none.
  const auto plan = [](int64_t cols) { return plan_norm_backward(backward_params(DType::kBFloat16, cols)); };
  EXPECT_EQ(plan(256).threads_per_row, 32);
  EXPECT_EQ(plan(256).items, 1);
  EXPECT_EQ(plan(512).threads_per_row, 32);
  EXPECT_EQ(plan(512).items, 2);
  EXPECT_EQ(plan(520).threads_per_row, kNormBackwardThreads);
  EXPECT_EQ(plan(520).items, 1);
  EXPECT_EQ(plan(4096).items, 2);
  EXPECT_EQ(plan(16384).items, 8);
  EXPECT_EQ(plan(16392).items, 0);
  EXPECT_FALSE(norm_backward_supported(backward_params(DType::kBFloat16, 16392)));
  EXPECT_TRUE(norm_backward_supported(backward_params(DType::kBFloat16, 16384)));
}

TEST(NormBackwardPlan, VectorizesOnlyWhenEveryPointerAndStrideAllows) {
  EXPECT_EQ(plan_norm_backward(backward_params(DType::kBFloat16, 2048)).vec, 8);
  EXPECT_EQ(plan_norm_backward(backward_params(DType::kFloat32, 2048)).vec, 4);
  NormBackwardParams strided = backward_params(DType::kBFloat16, 2048);
  strided.x_row_stride = 2051;  // rows D + 3 apart: one element at a time, so 2048 columns at most
  EXPECT_EQ(plan_norm_backward(strided).vec, 1);
  EXPECT_TRUE(norm_backward_supported(strided));
  strided.cols = 2049;
  EXPECT_FALSE(norm_backward_supported(strided));
  NormBackwardParams offset = backward_params(DType::kBFloat16, 2048);
  offset.weight = reinterpret_cast<const float*>(0x6008);  // a weight view 8 bytes in
  EXPECT_EQ(plan_norm_backward(offset).vec, 1);
}

}  // namespace
}  // namespace ltx_kernels

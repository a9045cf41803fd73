// CUDA kernels of the norm family vs the CPU reference; skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "ltx_kernels/norm.h"
#include "reference/convert.h"
#include "reference/fp8.h"

namespace ltx_kernels {
namespace {

using test::DeviceBuffer;
using test::has_gpu;
using test::random_buffer;

struct Case {
  NormType type;
  DType dtype;
  int64_t rows, cols, stride;
  bool residual, weight, bias;
  bool modulated = false;  // per-token scale/shift and, with a residual, a per-token gate
  // Mixed precision (16-bit dtype): weight and bias in fp32, and out too with fp32_out.
  bool fp32_weight = false, fp32_out = false;
};

// Runs one case on both sides and compares ||gpu - cpu|| / ||cpu|| per output.
void check_case(const Case& c) {
  std::mt19937 rng(static_cast<unsigned>(c.rows * 7919 + c.cols));
  const int64_t in_count = c.rows * c.stride;
  const int64_t out_count = c.rows * c.cols;
  const auto x = random_buffer(in_count, c.dtype, rng);
  const auto res = random_buffer(in_count, c.dtype, rng);
  const DType weight_dtype = c.fp32_weight ? DType::kFloat32 : c.dtype;
  const DType out_dtype = c.fp32_out ? DType::kFloat32 : c.dtype;
  const auto w = random_buffer(c.cols, weight_dtype, rng);
  const auto b = random_buffer(c.cols, weight_dtype, rng);
  // gate, scale, shift rows (drawn only when used: the largest buffer, and the slowest to fill)
  const auto mod = random_buffer(c.modulated ? 3 * out_count : 1, c.dtype, rng);
  // Poison outputs (NaN bytes) so unwritten elements fail.
  std::vector<uint8_t> out(out_count * dtype_size(out_dtype), 0xff);
  std::vector<uint8_t> res_out(out_count * dtype_size(c.dtype), 0xff);

  NormParams p;
  p.type = c.type;
  p.dtype = c.dtype;
  p.weight_dtype = weight_dtype;
  p.out_dtype = out_dtype;
  p.rows = c.rows;
  p.cols = c.cols;
  p.x_row_stride = p.residual_row_stride = c.stride;
  p.out_row_stride = p.new_residual_row_stride = c.cols;
  p.eps = 1e-5f;

  DeviceBuffer dx(x), dres(res), dw(w), db(b), dmod(mod), dout(out), dres_out(res_out);
  // Rows as [rows, 1] batches of one token, each with its own gate/scale/shift row.
  const auto set_mod = [&](const void* base) {
    if (!c.modulated) return;
    const auto at = [&](int k) { return static_cast<const uint8_t*>(base) + k * out_count * dtype_size(c.dtype); };
    p.tokens = 1;
    if (c.residual) p.gate = {at(0), c.cols, 0};
    p.scale = {at(1), c.cols, 0};
    p.shift = {at(2), c.cols, 0};
  };
  p.x = dx.ptr;
  p.out = dout.ptr;
  if (c.residual) p.residual = dres.ptr, p.new_residual = dres_out.ptr;
  if (c.weight) p.weight = dw.ptr;
  if (c.bias) p.bias = db.ptr;
  set_mod(dmod.ptr);
  ASSERT_EQ(launch(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto gpu_out = dout.to_host();
  const auto gpu_res = dres_out.to_host();

  p.x = x.data();
  p.out = out.data();
  if (c.residual) p.residual = res.data(), p.new_residual = res_out.data();
  if (c.weight) p.weight = w.data();
  if (c.bias) p.bias = b.data();
  set_mod(mod.data());
  reference(p);

  const double tol = out_dtype == DType::kFloat32 ? 1e-5 : out_dtype == DType::kFloat16 ? 2e-3 : 1e-2;
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < out_count; ++i) {
    const double g = host::load(gpu_out.data(), i, out_dtype);
    const double r = host::load(out.data(), i, out_dtype);
    ASSERT_TRUE(std::isfinite(g)) << "element " << i << " not written or not finite";
    diff += (g - r) * (g - r);
    norm += r * r;
  }
  EXPECT_LE(std::sqrt(diff / norm), tol) << "rows " << c.rows << " cols " << c.cols;
  if (c.residual) EXPECT_EQ(gpu_res, res_out) << "new residual differs from x + residual";
  if (c.fp32_weight) return;  // the FP8 output comes in one dtype only (validate)

  // The FP8 output: exactly quantize_fp8 of the GPU's own dtype output (the same launch,
  // once with both outputs, once with the FP8 one alone), bytes and scales.
  std::vector<uint8_t> q_host[2], s_host[2];
  for (const bool with_out : {true, false}) {
    DeviceBuffer dq(std::vector<uint8_t>(out_count, 0xff)), ds(std::vector<uint8_t>(c.rows * sizeof(float), 0xff));
    p.x = dx.ptr;
    p.out = with_out ? dout.ptr : nullptr;
    p.out_row_stride = with_out ? c.cols : 0;
    if (c.residual) p.residual = dres.ptr, p.new_residual = dres_out.ptr;
    if (c.weight) p.weight = dw.ptr;
    if (c.bias) p.bias = db.ptr;
    set_mod(dmod.ptr);
    p.out_fp8 = static_cast<uint8_t*>(dq.ptr);
    p.out_fp8_row_stride = c.cols;
    p.out_fp8_scale = static_cast<float*>(ds.ptr);
    ASSERT_EQ(launch(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    q_host[with_out] = dq.to_host();
    s_host[with_out] = ds.to_host();
  }
  EXPECT_EQ(dout.to_host(), gpu_out) << "the dtype output changed with an FP8 output beside it";
  EXPECT_EQ(q_host[0], q_host[1]);
  EXPECT_EQ(s_host[0], s_host[1]);
  std::vector<float> row(c.cols);
  std::vector<uint8_t> want(c.cols);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.cols; ++i) row[i] = host::load(gpu_out.data(), r * c.cols + i, c.dtype);
    float scale = 0, got_scale = 0;
    host::quantize_row(row.data(), c.cols, want.data(), &scale);
    std::memcpy(&got_scale, s_host[1].data() + r * sizeof(float), sizeof(float));
    ASSERT_EQ(std::vector<uint8_t>(q_host[1].begin() + r * c.cols, q_host[1].begin() + (r + 1) * c.cols), want)
        << "row " << r << " of " << c.rows << " x " << c.cols;
    ASSERT_EQ(got_scale, scale) << "row " << r;
  }
}

TEST(NormCuda, MatchesReference) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t cols : {1, 7, 111, 769, 2048, 4096, 5125, 16384, 32768, 40000}) {
      for (int64_t rows : {1, 3, 67}) {
        const int64_t stride = cols + (rows == 3 ? 8 : 0);  // strided rows, still aligned
        check_case({NormType::kRms, dtype, rows, cols, stride, false, true, false});
        check_case({NormType::kRms, dtype, rows, cols, stride, true, rows != 1, false});
        check_case({NormType::kLayer, dtype, rows, cols, stride, false, true, true});
        check_case({NormType::kRms, dtype, rows, cols, stride, true, true, false, true});
        check_case({NormType::kLayer, dtype, rows, cols, stride, false, false, true, true});
        if (dtype == DType::kFloat32) continue;
        for (const bool fp32_out : {false, true}) {
          check_case({NormType::kRms, dtype, rows, cols, stride, false, true, false, false, true, fp32_out});
          check_case({NormType::kRms, dtype, rows, cols, stride, true, true, false, false, true, fp32_out});
          check_case({NormType::kLayer, dtype, rows, cols, stride, false, true, true, false, true, fp32_out});
        }
      }
    }
  }
}

TEST(NormCuda, RefusesInvalidParams) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  NormParams p;
  p.rows = 1;
  p.cols = 0;
  EXPECT_EQ(launch(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ltx_kernels

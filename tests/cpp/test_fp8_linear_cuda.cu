// The Hopper FP8 GEMM (fp8_linear) vs the CPU reference; skipped without an sm_90 GPU or a
// build for sm_90a. Odd sizes (partial tiles in m, n and k), strided rows, both output dtypes,
// with and without bias, and the gated residual (batches of rows, each with its gate row).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "ltx_kernels/fp8_linear.h"
#include "reference/convert.h"

#ifdef LTX_KERNELS_SM90A
namespace ltx_kernels {
namespace {

using test::DeviceBuffer;
using test::device_arch;
using test::has_gpu;

struct Case {
  int64_t m, n, k;
  int64_t pad;  // extra elements per row of a, b and out (strided rows)
  DType out_dtype;
  bool bias;
  int64_t batches = 0;  // > 0: the gated residual, m / batches rows per gate row
};

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Random e4m3 operands as quantize_fp8 makes them (values spread over the whole range).
std::vector<uint8_t> random_e4m3(int64_t rows, int64_t cols, int64_t stride, std::mt19937& rng) {
  std::vector<uint8_t> out(rows * stride, 0x7f);  // padding NaN: must never be read
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * stride + c] = host::float_to_e4m3(normal(rng));
  return out;
}

void check_case(const Case& c) {
  SCOPED_TRACE(testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k << " pad " << c.pad << " out "
                                  << dtype_name(c.out_dtype) << " bias " << c.bias << " batches " << c.batches);
  std::mt19937 rng(static_cast<unsigned>(c.m * 7 + c.n * 13 + c.k));
  const int64_t ka = c.k + c.pad * 16, nout = c.n + c.pad * 8;  // row strides, 16-byte multiples
  const auto a = random_e4m3(c.m, c.k, ka, rng), b = random_e4m3(c.n, c.k, ka, rng);
  std::uniform_real_distribution<float> uniform(0.5f, 2.0f);
  std::vector<float> a_scale(c.m), b_scale(c.n);
  for (auto& s : a_scale) s = uniform(rng) / 448;
  for (auto& s : b_scale) s = uniform(rng) / 448;
  const int out_bytes = dtype_size(c.out_dtype);
  std::vector<uint8_t> bias(c.n * out_bytes);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < c.n; ++i) host::store(bias.data(), i, c.out_dtype, normal(rng));
  // Gated: residual rows as strided as out's, gate rows nout apart (a view of a wider tensor).
  const int64_t gate_rows = std::max<int64_t>(c.batches, 1);
  std::vector<uint8_t> residual(c.m * nout * out_bytes, 0), gate(gate_rows * nout * out_bytes, 0);
  for (int64_t i = 0; i < c.m * nout; ++i) host::store(residual.data(), i, c.out_dtype, 4 * normal(rng));
  for (int64_t i = 0; i < gate_rows * nout; ++i) host::store(gate.data(), i, c.out_dtype, normal(rng));

  Fp8LinearParams p;
  p.out_dtype = c.out_dtype;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.a_row_stride = p.b_row_stride = ka;
  p.out_row_stride = nout;
  p.arch = device_arch();
  std::vector<uint8_t> expected(c.m * nout * out_bytes, 0);
  p.a = a.data();
  p.b = b.data();
  p.a_scale = a_scale.data();
  p.b_scale = b_scale.data();
  p.bias = c.bias ? bias.data() : nullptr;
  p.out = expected.data();
  if (c.batches > 0) {
    p.residual = residual.data();
    p.residual_row_stride = nout;
    p.gate = gate.data();
    p.gate_batch_stride = nout;
    p.batch_rows = c.m / c.batches;
  }
  reference(p);

  DeviceBuffer da(a), db(b), das(bytes_of(a_scale)), dbs(bytes_of(b_scale)), dbias(bias),
      dout(std::vector<uint8_t>(expected.size(), 0)), dresidual(residual), dgate(gate);
  if (c.batches > 0) {
    p.residual = dresidual.ptr;
    p.gate = dgate.ptr;
  }
  p.a = static_cast<const uint8_t*>(da.ptr);
  p.b = static_cast<const uint8_t*>(db.ptr);
  p.a_scale = static_cast<const float*>(das.ptr);
  p.b_scale = static_cast<const float*>(dbs.ptr);
  p.bias = c.bias ? dbias.ptr : nullptr;
  p.out = dout.ptr;
  ASSERT_EQ(cuda_support(p), nullptr);
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, std::max<int64_t>(workspace_bytes(p), 1)), cudaSuccess);
  ASSERT_EQ(launch(p, workspace, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(workspace);
  const auto got = dout.to_host();

  double sum_sq = 0;
  for (int64_t m = 0; m < c.m; ++m)
    for (int64_t n = 0; n < c.n; ++n) sum_sq += std::pow(host::load(expected.data(), m * nout + n, c.out_dtype), 2);
  const double rms = std::sqrt(sum_sq / (c.m * c.n));
  // Both sides round to the output dtype, so they may differ by one step of it (a step is at
  // most 2^-7 of the value in bf16, 2^-10 in fp16), plus the FP8 accumulator's truncation,
  // which grows with k (tests/python/test_fp8.py: fp8_accumulator_error).
  const double rtol = c.out_dtype == DType::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
  const double atol = 5e-4 * std::max(1.0, c.k / 64.0) * rms;
  int bad = 0;
  for (int64_t m = 0; m < c.m; ++m) {
    for (int64_t n = 0; n < nout; ++n) {
      const float want = host::load(expected.data(), m * nout + n, c.out_dtype);
      const float have = host::load(got.data(), m * nout + n, c.out_dtype);
      if (n >= c.n) {  // padding between rows: never written
        if (have != 0.0f && bad++ < 5) ADD_FAILURE() << "wrote padding at " << m << ", " << n;
        continue;
      }
      if (!(std::fabs(have - want) <= atol + rtol * std::fabs(want)) && bad++ < 5)
        ADD_FAILURE() << "at " << m << ", " << n << ": " << have << " vs " << want << " (rms " << rms << ")";
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Fp8LinearCuda, MatchesTheReference) {
  if (!has_gpu() || device_arch() / 10 != 9) GTEST_SKIP() << "needs a Hopper GPU";
  const Case cases[] = {
      {1, 8, 16, 0, DType::kBFloat16, false},     {7, 24, 48, 1, DType::kFloat16, true},
      {129, 264, 272, 0, DType::kBFloat16, true}, {300, 520, 1040, 2, DType::kBFloat16, true},
      {256, 512, 4096, 0, DType::kFloat16, false}, {1000, 776, 144, 1, DType::kFloat16, true},
      // Gated residual: one batch, two of 2688 rows (an LTX step's CFG pair at 49 frames, one
      // third of the width), odd batches whose rows end inside a tile.
      {256, 264, 272, 0, DType::kBFloat16, true, 1}, {5376, 688, 2048, 0, DType::kBFloat16, true, 2},
      {3 * 129, 520, 1040, 2, DType::kFloat16, false, 3}, {2 * 7, 24, 48, 1, DType::kBFloat16, true, 2},
  };
  for (const Case& c : cases) check_case(c);
}

TEST(Fp8LinearCuda, RefusesWhatItCannotRun) {
  Fp8LinearParams p;
  p.m = p.n = p.k = 16;
  p.arch = 90;
  p.out_dtype = DType::kFloat32;
  EXPECT_NE(cuda_support(p), nullptr);  // fp32 out
  p.out_dtype = DType::kBFloat16;
  p.k = 24;
  EXPECT_NE(cuda_support(p), nullptr);  // k not a multiple of 16
  p.k = 16;
  p.arch = 80;
  EXPECT_NE(cuda_support(p), nullptr);  // not Hopper
  EXPECT_EQ(launch(p, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ltx_kernels
#endif

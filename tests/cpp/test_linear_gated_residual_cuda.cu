// The Hopper 16-bit gated GEMM (linear_gated_residual) vs the CPU reference; skipped without an
// sm_90 GPU or a build for sm_90a. Partial tiles in m, n and k, batches that end inside a tile,
// strided rows, both dtypes, bias and gate on and off, and a width that takes the swizzled
// persistent scheduler (128 tiles of N and more: gemm_sm90::swizzle).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "ltx_kernels/linear_gated_residual.h"
#include "reference/convert.h"

#ifdef LTX_KERNELS_SM90A
namespace ltx_kernels {
namespace {

using test::DeviceBuffer;
using test::device_arch;
using test::has_gpu;

struct Case {
  int64_t m, n, k;
  int64_t pad;  // extra elements per row of every tensor, a multiple of 8 (16-byte rows)
  DType dtype;
  bool bias, gate;
  int64_t batches;  // gate rows; m / batches rows each
};

// rows x cols of normals (times scale) in dtype, row stride `stride`, the padding NaN: read by
// mistake, it poisons the output.
std::vector<uint8_t> random_rows(DType dtype, int64_t rows, int64_t cols, int64_t stride, float scale,
                                 std::mt19937& rng) {
  std::vector<uint8_t> buf(rows * stride * dtype_size(dtype));
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < stride; ++c) host::store(buf.data(), r * stride + c, dtype, c < cols ? normal(rng) : NAN);
  return buf;
}

void check_case(const Case& c) {
  SCOPED_TRACE(testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k << " pad " << c.pad << " "
                                  << dtype_name(c.dtype) << " bias " << c.bias << " gate " << c.gate << " batches "
                                  << c.batches);
  std::mt19937 rng(static_cast<unsigned>(c.m * 7 + c.n * 13 + c.k * 3 + c.pad));
  const int bytes = dtype_size(c.dtype);
  // Distinct strides per tensor (a mix-up shows), every one a multiple of 8 elements.
  const int64_t sa = c.k + c.pad, sb = c.k + 2 * c.pad, sout = c.n + c.pad, sres = c.n + 2 * c.pad,
                sgate = c.n + 3 * c.pad;
  const auto a = random_rows(c.dtype, c.m, c.k, sa, 1.0f, rng), b = random_rows(c.dtype, c.n, c.k, sb, 1.0f, rng);
  const auto bias = random_rows(c.dtype, 1, c.n, c.n, 1.0f, rng);
  const auto residual = random_rows(c.dtype, c.m, c.n, sres, 4.0f, rng);
  const auto gate = random_rows(c.dtype, c.batches, c.n, sgate, 1.0f, rng);
  // out all NaN bytes (0xffff is NaN in bf16 and fp16): the kernel must write every element,
  // and never the padding.
  const std::vector<uint8_t> poisoned(c.m * sout * bytes, 0xff);

  LinearGatedResidualParams p;
  p.dtype = c.dtype;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.a_row_stride = sa;
  p.b_row_stride = sb;
  p.out_row_stride = sout;
  p.residual_row_stride = sres;
  p.gate_batch_stride = sgate;
  p.batch_rows = c.m / c.batches;
  p.arch = device_arch();
  std::vector<uint8_t> expected = poisoned;
  p.a = a.data();
  p.b = b.data();
  p.bias = c.bias ? bias.data() : nullptr;
  p.out = expected.data();
  p.residual = residual.data();
  p.gate = c.gate ? gate.data() : nullptr;
  ASSERT_EQ(validate(p), nullptr);
  reference(p);

  DeviceBuffer da(a), db(b), dbias(bias), dout(poisoned), dresidual(residual), dgate(gate);
  p.a = da.ptr;
  p.b = db.ptr;
  p.bias = c.bias ? dbias.ptr : nullptr;
  p.out = dout.ptr;
  p.residual = dresidual.ptr;
  p.gate = c.gate ? dgate.ptr : nullptr;
  ASSERT_EQ(cuda_support(p), nullptr);
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, std::max<int64_t>(workspace_bytes(p), 1)), cudaSuccess);
  ASSERT_EQ(launch(p, workspace, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(workspace);
  const auto got = dout.to_host();

  // Both sides sum in fp32 (in different orders) and round once to dtype, so they may differ
  // by one step of dtype (at most 2^-7 of the value in bf16, 2^-10 in fp16) plus the sums'
  // fp32 rounding, a tiny fraction of the output's scale.
  double err_sq = 0, ref_sq = 0, out_sq = 0;
  for (int64_t m = 0; m < c.m; ++m)
    for (int64_t n = 0; n < c.n; ++n) out_sq += std::pow(host::load(expected.data(), m * sout + n, c.dtype), 2);
  const double rms = std::sqrt(out_sq / (c.m * c.n));
  const double rtol = c.dtype == DType::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
  const double atol = 1e-4 * rms;
  int bad = 0;
  for (int64_t m = 0; m < c.m; ++m) {
    for (int64_t n = 0; n < sout; ++n) {
      const int64_t i = m * sout + n;
      if (n >= c.n) {  // padding between rows: never written
        if (std::memcmp(got.data() + i * bytes, poisoned.data() + i * bytes, bytes) != 0 && bad++ < 5)
          ADD_FAILURE() << "wrote padding at " << m << ", " << n;
        continue;
      }
      const double want = host::load(expected.data(), i, c.dtype), have = host::load(got.data(), i, c.dtype);
      err_sq += (have - want) * (have - want);
      ref_sq += want * want;
      if (!(std::fabs(have - want) <= atol + rtol * std::fabs(want)) && bad++ < 5)  // NaN fails
        ADD_FAILURE() << "at " << m << ", " << n << ": " << have << " vs " << want << " (rms " << rms << ")";
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_LE(std::sqrt(err_sq / ref_sq), c.dtype == DType::kBFloat16 ? 1e-2 : 2e-3);
}

TEST(LinearGatedResidualCuda, MatchesTheReference) {
  if (!has_gpu() || device_arch() / 10 != 9) GTEST_SKIP() << "needs a Hopper GPU";
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  const Case cases[] = {
      // Partial tiles (128 x 128 x 64) in m, n and k, one batch.
      {1, 8, 8, 0, bf16, false, false, 1},
      {1, 136, 72, 8, fp16, true, true, 1},
      {129, 520, 264, 0, bf16, true, true, 1},
      {300, 136, 8, 16, fp16, false, true, 1},
      {300, 8, 264, 8, bf16, true, false, 1},
      // Batches of 129 rows: batch 0 ends at row 128, inside the second 128-row tile of the
      // flat [m, n] view, so the kernel must clip each batch's tiles at its end and switch gate
      // rows there.
      {2 * 129, 520, 72, 0, bf16, true, true, 2},
      {3 * 129, 136, 264, 8, fp16, true, true, 3},
      {3 * 129, 520, 8, 8, bf16, false, true, 3},
      {4 * 75, 8, 72, 16, fp16, true, false, 4},
      // 128 tiles of N: the swizzled scheduler.
      {256, 16384, 64, 0, bf16, true, true, 2},
      {256, 16384, 64, 8, fp16, false, true, 2},
  };
  for (const Case& c : cases) check_case(c);
}

TEST(LinearGatedResidualCuda, RefusesWhatItCannotRun) {
  // A supported 16 x 16 x 16 problem at aligned (never dereferenced) addresses; each check
  // breaks one thing, and launch() refuses it before touching memory.
  char* const base = reinterpret_cast<char*>(uintptr_t{1} << 20);
  LinearGatedResidualParams ok;
  ok.dtype = DType::kBFloat16;
  ok.m = ok.n = ok.k = 16;
  ok.a = base;
  ok.b = base + 4096;
  ok.bias = base + 8192;
  ok.out = base + 12288;
  ok.residual = base + 16384;
  ok.gate = base + 20480;
  ok.a_row_stride = ok.b_row_stride = ok.out_row_stride = ok.residual_row_stride = ok.gate_batch_stride = 16;
  ok.batch_rows = 16;
  ok.arch = 90;
  ASSERT_EQ(cuda_support(ok), nullptr);

  const auto refuses = [&](const char* what, auto&& change) {
    LinearGatedResidualParams p = ok;
    change(p);
    EXPECT_NE(cuda_support(p), nullptr) << what;
    EXPECT_EQ(launch(p, nullptr, nullptr), cudaErrorInvalidValue) << what;
  };
  refuses("fp32", [](auto& p) { p.dtype = DType::kFloat32; });
  refuses("k not a multiple of 8", [](auto& p) { p.k = 12; });
  refuses("n not a multiple of 8", [](auto& p) { p.n = 12; });
  refuses("misaligned a", [&](auto& p) { p.a = base + 2; });
  refuses("misaligned b", [&](auto& p) { p.b = base + 4096 + 2; });
  refuses("misaligned out", [&](auto& p) { p.out = base + 12288 + 2; });
  refuses("misaligned residual", [&](auto& p) { p.residual = base + 16384 + 2; });
  refuses("misaligned gate", [&](auto& p) { p.gate = base + 20480 + 2; });
  refuses("misaligned bias", [&](auto& p) { p.bias = base + 8192 + 2; });
  refuses("a rows not 16-byte multiples", [](auto& p) { p.a_row_stride = 20; });
  refuses("gate rows not 16-byte multiples", [](auto& p) { p.gate_batch_stride = 20; });
  refuses("not Hopper", [](auto& p) { p.arch = 80; });
}

}  // namespace
}  // namespace ltx_kernels
#endif

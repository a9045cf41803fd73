// Host-side tests of linear_gated_residual: the CPU reference (the CUDA kernel's oracle) against
// the formula evaluated in double, over every dtype, odd sizes, strided rows, bias and gate on
// and off, several batches; and validate()'s refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ltx_kernels/linear_gated_residual.h"
#include "reference/convert.h"

namespace ltx_kernels {
namespace {

struct Case {
  DType dtype;
  int64_t m, n, k;
  int64_t pad;  // extra elements per row of every tensor (strided rows)
  bool bias, gate;
  int64_t batches;  // gate rows; m / batches rows each
};

// rows x cols of standard normals (scaled) in dtype, row stride `stride`; the padding NaN, so
// that a read of it poisons the result. The trailing row of padding guards the buffer's end.
std::vector<uint8_t> random_rows(DType dtype, int64_t rows, int64_t cols, int64_t stride, float scale,
                                 std::mt19937& rng) {
  std::vector<uint8_t> buf((rows + 1) * stride * dtype_size(dtype));
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t r = 0; r <= rows; ++r)
    for (int64_t c = 0; c < stride; ++c)
      host::store(buf.data(), r * stride + c, dtype, r < rows && c < cols ? normal(rng) : NAN);
  return buf;
}

void check_case(const Case& c) {
  SCOPED_TRACE(testing::Message() << dtype_name(c.dtype) << " m " << c.m << " n " << c.n << " k " << c.k << " pad "
                                  << c.pad << " bias " << c.bias << " gate " << c.gate << " batches " << c.batches);
  std::mt19937 rng(static_cast<unsigned>(c.m * 7 + c.n * 13 + c.k * 3 + c.pad));
  const int bytes = dtype_size(c.dtype);
  // Distinct strides per tensor, so that a stride mix-up shows; the gate's rows further apart
  // than n (a view of a wider tensor).
  const int64_t sa = c.k + c.pad, sb = c.k + 2 * c.pad, sout = c.n + c.pad, sres = c.n + 3 * c.pad,
                sgate = c.n + 2 * c.pad + 1;
  const auto a = random_rows(c.dtype, c.m, c.k, sa, 1.0f, rng), b = random_rows(c.dtype, c.n, c.k, sb, 1.0f, rng);
  const auto bias = random_rows(c.dtype, 1, c.n, c.n, 1.0f, rng);
  const auto residual = random_rows(c.dtype, c.m, c.n, sres, 4.0f, rng);
  const auto gate = random_rows(c.dtype, c.batches, c.n, sgate, 1.0f, rng);
  // out all NaN bytes: whatever is not written keeps that pattern.
  std::vector<uint8_t> out(c.m * sout * bytes, 0xff);
  const std::vector<uint8_t> before = out;

  LinearGatedResidualParams p;
  p.dtype = c.dtype;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.a = c.k > 0 ? a.data() : nullptr;  // k == 0: a and b are never read
  p.a_row_stride = sa;
  p.b = c.k > 0 ? b.data() : nullptr;
  p.b_row_stride = sb;
  p.bias = c.bias ? bias.data() : nullptr;
  p.out = out.data();
  p.out_row_stride = sout;
  p.residual = residual.data();
  p.residual_row_stride = sres;
  p.gate = c.gate ? gate.data() : nullptr;
  p.gate_batch_stride = sgate;
  p.batch_rows = c.m / c.batches;
  ASSERT_EQ(validate(p), nullptr);
  reference(p);

  const auto at = [&](const std::vector<uint8_t>& v, int64_t i) {
    return static_cast<double>(host::load(v.data(), i, c.dtype));
  };
  double err_sq = 0, ref_sq = 0;
  for (int64_t m = 0; m < c.m; ++m) {
    for (int64_t n = 0; n < c.n; ++n) {
      double acc = c.bias ? at(bias, n) : 0.0;
      for (int64_t k = 0; k < c.k; ++k) acc += at(a, m * sa + k) * at(b, n * sb + k);
      const double g = c.gate ? at(gate, m / p.batch_rows * sgate + n) : 1.0;
      const double want = at(residual, m * sres + n) + g * acc;
      err_sq += std::pow(at(out, m * sout + n) - want, 2);  // NaN (unwritten, padding read) fails below
      ref_sq += want * want;
    }
    // Padding between rows: never written.
    for (int64_t n = c.n; n < sout; ++n) {
      const int64_t i = (m * sout + n) * bytes;
      EXPECT_EQ(std::memcmp(out.data() + i, before.data() + i, bytes), 0) << "wrote padding at " << m << ", " << n;
    }
  }
  // Rounding once to dtype: a relative error of at most 2^-24, 2^-11, 2^-8 per element.
  const double tol = c.dtype == DType::kFloat32 ? 1e-5 : c.dtype == DType::kFloat16 ? 2e-3 : 1e-2;
  const double rel_l2 = std::sqrt(err_sq / ref_sq);
  EXPECT_LE(rel_l2, tol);  // false for NaN
}

TEST(LinearGatedResidualReference, MatchesTheFormulaInDouble) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    const Case cases[] = {
        {dtype, 1, 1, 1, 0, false, false, 1},   {dtype, 7, 33, 1, 0, true, true, 1},
        {dtype, 33, 7, 33, 3, true, true, 3},   {dtype, 12, 9, 7, 1, false, true, 4},
        {dtype, 20, 16, 64, 8, true, false, 5}, {dtype, 21, 5, 33, 2, true, true, 7},
        {dtype, 6, 7, 0, 1, true, true, 2},  // k == 0: out = residual + gate * bias
    };
    for (const Case& c : cases) check_case(c);
  }
}

TEST(LinearGatedResidualReference, RoundsOnceToDtype) {
  // bf16: acc + bias = 1 + 2^-9, below half a step of bf16 above 1. Rounded once, residual -1
  // leaves 2^-9; linear then gated_residual (the linear rounded to bf16 first) would give 0.
  const uint16_t one = host::float_to_bf16(1.0f), bias = host::float_to_bf16(0.001953125f),
                 residual = host::float_to_bf16(-1.0f);
  uint16_t out = 0xffff;
  LinearGatedResidualParams p;
  p.dtype = DType::kBFloat16;
  p.m = p.n = p.k = 1;
  p.a = p.b = &one;
  p.a_row_stride = p.b_row_stride = p.out_row_stride = p.residual_row_stride = 1;
  p.bias = &bias;
  p.residual = &residual;
  p.out = &out;
  p.batch_rows = 1;
  ASSERT_EQ(validate(p), nullptr);
  reference(p);
  EXPECT_EQ(host::bf16_to_float(out), 0.001953125f);
}

TEST(LinearGatedResidualReference, ValidateRefusesBadParams) {
  // One valid 4 x 4 x 4 problem; each check below breaks one thing.
  const std::vector<float> buf(64, 0.0f);
  std::vector<float> out(16);
  LinearGatedResidualParams ok;
  ok.dtype = DType::kFloat32;
  ok.m = ok.n = ok.k = 4;
  ok.a = ok.b = ok.residual = ok.gate = ok.bias = buf.data();
  ok.out = out.data();
  ok.a_row_stride = ok.b_row_stride = ok.out_row_stride = ok.residual_row_stride = ok.gate_batch_stride = 4;
  ok.batch_rows = 2;
  ASSERT_EQ(validate(ok), nullptr);

  const auto refuses = [&](const char* what, auto&& change) {
    LinearGatedResidualParams p = ok;
    change(p);
    EXPECT_NE(validate(p), nullptr) << what;
  };
  refuses("m < 0", [](auto& p) { p.m = -1; });
  refuses("n < 0", [](auto& p) { p.n = -1; });
  refuses("k < 0", [](auto& p) { p.k = -1; });
  refuses("null out", [](auto& p) { p.out = nullptr; });
  refuses("null residual", [](auto& p) { p.residual = nullptr; });
  refuses("batch_rows 0", [](auto& p) { p.batch_rows = 0; });
  refuses("batch_rows not dividing m", [](auto& p) { p.batch_rows = 3; });
  refuses("out rows overlap", [](auto& p) { p.out_row_stride = 3; });
  refuses("residual rows overlap", [](auto& p) { p.residual_row_stride = 3; });
  refuses("null a", [](auto& p) { p.a = nullptr; });
  refuses("null b", [](auto& p) { p.b = nullptr; });

  // Nothing to compute: nothing to check.
  LinearGatedResidualParams empty = ok;
  empty.m = 0;
  empty.a = empty.b = empty.residual = empty.gate = empty.bias = empty.out = nullptr;
  empty.batch_rows = 0;
  EXPECT_EQ(validate(empty), nullptr);
  // No gate and no bias are allowed (ones, zeros); k == 0 needs no a or b.
  LinearGatedResidualParams plain = ok;
  plain.gate = plain.bias = nullptr;
  EXPECT_EQ(validate(plain), nullptr);
  plain.k = 0;
  plain.a = plain.b = nullptr;
  EXPECT_EQ(validate(plain), nullptr);
}

}  // namespace
}  // namespace ltx_kernels

// The CUDA attention kernels (both precisions) vs the CPU reference; skipped without a GPU.
// On a Hopper GPU both the Hopper kernel and the portable one run (AttentionParams::arch picks).
// Small shapes, so that compute-sanitizer (memcheck, racecheck) can run them too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "ltx_kernels/attention.h"
#include "reference/convert.h"

namespace ltx_kernels {
namespace {

using test::DeviceBuffer;
using test::device_arch;
using test::has_gpu;
using test::random_buffer;

struct Case {
  AttentionPrecision precision;
  DType dtype;
  int64_t batch, heads_q, heads_kv, seq_q, seq_k, dim;
  bool mask;  // key padding in batch 1, one fully masked row in batch 0, random elsewhere
  int arch;   // the kernel: 90 Hopper, 80 portable
};

Strides4 contiguous(int64_t heads, int64_t seq, int64_t dim) { return {heads * seq * dim, seq * dim, dim}; }

std::vector<float> widened(const std::vector<uint8_t>& buf, DType dtype) {
  std::vector<float> out(buf.size() / dtype_size(dtype));
  for (size_t i = 0; i < out.size(); ++i) out[i] = host::load(buf.data(), static_cast<int64_t>(i), dtype);
  return out;
}

void check_case(const Case& c) {
  SCOPED_TRACE(testing::Message() << "precision " << static_cast<int>(c.precision) << " dtype "
                                  << dtype_name(c.dtype) << " B " << c.batch << " Hq " << c.heads_q << " Hkv "
                                  << c.heads_kv << " Sq " << c.seq_q << " Sk " << c.seq_k << " D " << c.dim
                                  << " mask " << c.mask << " arch " << c.arch);
  std::mt19937 rng(static_cast<unsigned>(c.seq_q * 131 + c.seq_k * 7 + c.dim));
  const int64_t q_count = c.batch * c.heads_q * c.seq_q * c.dim, kv_count = c.batch * c.heads_kv * c.seq_k * c.dim;
  const auto q = random_buffer(q_count, c.dtype, rng), k = random_buffer(kv_count, c.dtype, rng),
             v = random_buffer(kv_count, c.dtype, rng);
  std::vector<float> mask;
  if (c.mask) {
    const float inf = std::numeric_limits<float>::infinity();
    std::normal_distribution<float> normal;
    mask.resize(c.batch * c.seq_q * c.seq_k);
    for (float& m : mask) m = normal(rng);
    for (int64_t j = 0; j < c.seq_k; ++j) {
      mask[j] = -inf;                                                                // batch 0, row 0
      if (c.batch > 1 && j >= (c.seq_k + 1) / 2)
        for (int64_t i = 0; i < c.seq_q; ++i) mask[(c.seq_q + i) * c.seq_k + j] = -inf;  // batch 1 padding
    }
  }
  std::vector<uint8_t> mask_bytes(mask.size() * sizeof(float));
  std::copy_n(reinterpret_cast<const uint8_t*>(mask.data()), mask_bytes.size(), mask_bytes.data());

  AttentionParams p;
  p.dtype = c.dtype;
  p.precision = c.precision;
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.seq_q = c.seq_q;
  p.seq_k = c.seq_k;
  p.head_dim = c.dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
  p.q_strides = p.out_strides = contiguous(c.heads_q, c.seq_q, c.dim);
  p.k_strides = p.v_strides = contiguous(c.heads_kv, c.seq_k, c.dim);
  p.mask_strides = {c.seq_q * c.seq_k, 0, c.seq_k};
  p.arch = c.arch;

  DeviceBuffer dq(q), dk(k), dv(v), dmask(mask_bytes);
  DeviceBuffer dout(std::vector<uint8_t>(q.size(), 0xff));  // NaN bytes: unwritten elements fail
  DeviceBuffer workspace(std::vector<uint8_t>(std::max<int64_t>(workspace_bytes(p), 1)));
  p.q = dq.ptr, p.k = dk.ptr, p.v = dv.ptr, p.out = dout.ptr;
  p.mask = c.mask ? static_cast<const float*>(dmask.ptr) : nullptr;
  ASSERT_EQ(cuda_support(p), nullptr);
  ASSERT_EQ(launch(p, workspace.ptr, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> gpu = widened(dout.to_host(), c.dtype);

  // The reference on the same values in fp32, its output unrounded.
  const std::vector<float> qf = widened(q, c.dtype), kf = widened(k, c.dtype), vf = widened(v, c.dtype);
  std::vector<float> ref(q_count);
  p.dtype = DType::kFloat32;
  p.q = qf.data(), p.k = kf.data(), p.v = vf.data(), p.out = ref.data();
  p.mask = c.mask ? mask.data() : nullptr;
  reference(p);

  const double tol = c.dtype == DType::kFloat16 ? 2e-3 : 1e-2;
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < q_count; ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << "element " << i << " not written or not finite";
    diff += (gpu[i] - ref[i]) * static_cast<double>(gpu[i] - ref[i]);
    norm += ref[i] * static_cast<double>(ref[i]);
  }
  EXPECT_LE(std::sqrt(diff / std::max(norm, 1e-30)), tol);
  if (c.mask)  // batch 0, every head, row 0: all keys masked -> exact zeros
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t d = 0; d < c.dim; ++d) EXPECT_EQ(gpu[h * c.seq_q * c.dim + d], 0.0f);
}

TEST(AttentionCuda, MatchesReference) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<int> archs = {80};
  if (device_arch() / 10 == 9) archs.push_back(device_arch());
  for (int arch : archs) {
    for (AttentionPrecision precision : {AttentionPrecision::kExact, AttentionPrecision::kInt8QK}) {
      for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
        check_case({precision, dtype, 1, 1, 1, 1, 1, 64, false, arch});
        check_case({precision, dtype, 2, 2, 1, 7, 129, 128, false, arch});
        check_case({precision, dtype, 1, 4, 2, 129, 70, 64, false, arch});
        check_case({precision, dtype, 2, 2, 2, 65, 200, 128, true, arch});
        check_case({precision, dtype, 2, 1, 1, 130, 64, 64, true, arch});
        check_case({precision, dtype, 1, 2, 2, 300, 390, 64, false, arch});
      }
    }
  }
}

TEST(AttentionCuda, RefusesWhatItDoesNotSupport) {
  AttentionParams p;
  p.batch = p.heads_q = p.heads_kv = p.seq_q = p.seq_k = 1;
  p.head_dim = 64;
  p.dtype = DType::kFloat32;
  EXPECT_STREQ(cuda_support(p), "q, k and v must be bfloat16 or float16");
  p.dtype = DType::kBFloat16;
  p.head_dim = 80;
  EXPECT_STREQ(cuda_support(p), "head_dim must be 64 or 128");
  p.head_dim = 64;
  alignas(16) static uint16_t buffer[128];
  p.q = p.k = p.v = buffer;
  p.out = buffer + 1;
  EXPECT_STREQ(cuda_support(p), "every row of q, k, v and out must start 16-byte aligned");
  if (has_gpu()) EXPECT_EQ(launch(p, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ltx_kernels

// Host-side logic of linear_gated_residual: argument validation and what the CUDA kernel
// supports.
#include "ltx_kernels/linear_gated_residual.h"
#include "ops/host_util.h"

namespace ltx_kernels {

ValidationError validate(const LinearGatedResidualParams& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return "m, n and k must be >= 0";
  if (p.m == 0 || p.n == 0) return nullptr;
  if (p.out == nullptr || p.residual == nullptr) return "out or residual is null";
  if (p.out_row_stride < p.n && p.m > 1) return "out rows overlap (out_row_stride < n)";
  if (p.residual_row_stride < p.n && p.m > 1) return "residual rows overlap (residual_row_stride < n)";
  if (p.batch_rows <= 0 || p.m % p.batch_rows != 0) return "batch_rows must be > 0 and divide m";
  if (p.gate_batch_stride < 0) return "gate_batch_stride must be >= 0";
  if (p.k == 0) return nullptr;
  if (p.a == nullptr || p.b == nullptr) return "a or b is null";
  if (p.a_row_stride < 0 || p.b_row_stride < 0) return "row strides must be >= 0";
  return nullptr;
}

ValidationError cuda_support(const LinearGatedResidualParams& p) {
#ifndef LTX_KERNELS_SM90A
  (void)p;
  return "the 16-bit gated GEMM kernel needs a build for sm_90a (Hopper)";
#else
  using host_util::aligned16;
  if (p.arch / 10 != 9) return "the 16-bit gated GEMM kernel runs on Hopper (compute capability 9.x) only";
  if (p.dtype == DType::kFloat32) return "the 16-bit gated GEMM kernel takes bfloat16 or float16, not float32";
  if (p.k % 8 != 0 || p.n % 8 != 0) return "the 16-bit gated GEMM kernel needs k and n multiples of 8";
  constexpr int kBytes = 2;
  const auto aligned_rows = [](const void* ptr, int64_t row_stride) {
    return aligned16(ptr) && (row_stride * kBytes) % 16 == 0;
  };
  if (!aligned_rows(p.a, p.a_row_stride) || !aligned_rows(p.b, p.b_row_stride) ||
      !aligned_rows(p.out, p.out_row_stride) || !aligned_rows(p.residual, p.residual_row_stride) ||
      !aligned_rows(p.gate, p.gate_batch_stride) || !aligned16(p.bias))
    return "the 16-bit gated GEMM kernel needs 16-byte aligned rows (TMA)";
  return nullptr;
#endif
}

}  // namespace ltx_kernels

// Host-side logic of the FP8 linear: argument validation and what the CUDA kernel supports.
#include "ltx_kernels/fp8_linear.h"
#include "ops/host_util.h"

namespace ltx_kernels {

ValidationError validate(const Fp8LinearParams& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return "m, n and k must be >= 0";
  if (p.m == 0 || p.n == 0) return nullptr;
  if (p.out == nullptr) return "out is null";
  if (p.out_row_stride < p.n && p.m > 1) return "out rows overlap (out_row_stride < n)";
  if (p.a_scale == nullptr || p.b_scale == nullptr) return "a_scale or b_scale is null";
  if (p.gate != nullptr && p.residual == nullptr) return "a gate needs a residual";
  if (p.activation != Fp8Activation::kNone && p.activation != Fp8Activation::kGeluTanh) return "unknown activation";
  if (p.activation != Fp8Activation::kNone && p.residual != nullptr) {
    return "an activation does not go with the gated residual";
  }
  if (p.residual != nullptr) {
    if (p.batch_rows <= 0 || p.m % p.batch_rows != 0) return "batch_rows must be > 0 and divide m";
    if (p.residual_row_stride < p.n && p.m > 1) return "residual rows overlap (residual_row_stride < n)";
    if (p.gate_batch_stride < 0) return "gate_batch_stride must be >= 0";
  }
  if (p.k == 0) return nullptr;
  if (p.a == nullptr || p.b == nullptr) return "a or b is null";
  if (p.a_row_stride < 0 || p.b_row_stride < 0) return "row strides must be >= 0";
  return nullptr;
}

ValidationError cuda_support(const Fp8LinearParams& p) {
#ifndef LTX_KERNELS_SM90A
  return "the FP8 GEMM kernel needs a build for sm_90a (Hopper)";
#else
  using host_util::aligned16;
  if (p.arch / 10 != 9) return "the FP8 GEMM kernel runs on Hopper (compute capability 9.x) only";
  if (p.out_dtype == DType::kFloat32) return "the FP8 GEMM kernel writes bfloat16 or float16, not float32";
  if (p.k % 16 != 0 || p.n % 8 != 0) return "the FP8 GEMM kernel needs k a multiple of 16 and n of 8";
  const int out_bytes = dtype_size(p.out_dtype);
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.out) || !aligned16(p.bias) || p.a_row_stride % 16 != 0 ||
      p.b_row_stride % 16 != 0 || (p.out_row_stride * out_bytes) % 16 != 0)
    return "the FP8 GEMM kernel needs 16-byte aligned rows (TMA)";
  if (p.residual != nullptr &&
      (!aligned16(p.residual) || !aligned16(p.gate) || (p.residual_row_stride * out_bytes) % 16 != 0 ||
       (p.gate_batch_stride * out_bytes) % 16 != 0))
    return "the FP8 GEMM kernel needs 16-byte aligned residual and gate rows";
  return nullptr;
#endif
}

}  // namespace ltx_kernels

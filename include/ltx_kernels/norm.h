// Row normalization family: rms_norm, fused_add_rms_norm, layer_norm, and their DiT forms
// with AdaLN modulation and a gated residual (adaln_*, gated_residual_adaln_rms_norm).
//
// Every op normalizes each row of a [rows, cols] matrix whose last dim is contiguous and
// whose rows may be strided (a slice or view of a wider tensor). Math is fp32: inputs are
// loaded, computed in fp32 and rounded once on store. In full:
//   h   = residual + x * gate   (rounded to dtype, stored to new_residual; or h = x)
//   y   = norm(h) * (weight + weight_offset) + bias
//   out = y * (1 + scale) + shift
// Mixed precision (x 16-bit): weight and bias may be float32, as models keep them
// (_keep_in_fp32_modules, fp32 master weights), and out may then be float32 too, as a module
// whose formula promotes (diffusers' RMSNorm, transformers' LlamaRMSNorm) returns it.
// With an FP8 output, out (rounded to dtype, as it would be stored) is quantized per row to
// e4m3 with quantize.h's format: exactly quantize_fp8(out), in one pass (the norm feeding an
// FP8 GEMM).
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

enum class NormType : int32_t {
  kRms = 0,    // x * rsqrt(mean(x^2) + eps)
  kLayer = 1,  // (x - mean) * rsqrt(var + eps), biased variance
};

struct NormParams {
  NormType type = NormType::kRms;
  DType dtype = DType::kFloat32;  // of every tensor below but weight, bias and out:
  // dtype or float32 (mixed precision), float32 only without scale / shift or an FP8 output
  // (the forms torch modules compute: rms_norm, fused_add_rms_norm, layer_norm); a float32
  // out needs a float32 weight_dtype.
  DType weight_dtype = DType::kFloat32;  // of weight and bias
  DType out_dtype = DType::kFloat32;     // of out
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 1e-6f;

  const void* x = nullptr;  // [rows, cols], row stride x_row_stride (elements)
  int64_t x_row_stride = 0;

  // Optional: when set, the op normalizes h = residual + x [* gate], rounded to dtype, and
  // stores that same rounded h to new_residual (which may alias residual: update in place).
  const void* residual = nullptr;  // [rows, cols]
  int64_t residual_row_stride = 0;
  void* new_residual = nullptr;  // [rows, cols]
  int64_t new_residual_row_stride = 0;

  const void* weight = nullptr;  // [cols] optional: out *= (weight + weight_offset)
  float weight_offset = 0.0f;    // 1 for Gemma's (1 + weight)
  const void* bias = nullptr;    // [cols] optional, layer norm only: out += bias

  // Rows per batch for the RowVectors below; rows must be a multiple of it.
  int64_t tokens = 1;
  RowVectors gate;   // optional, only with residual
  RowVectors scale;  // optional AdaLN modulation, scale and shift together
  RowVectors shift;

  void* out = nullptr;  // [rows, cols]; optional when out_fp8 is set (then null, stride 0)
  int64_t out_row_stride = 0;

  // Optional FP8 output: e4m3 bytes [rows, cols] and one fp32 scale per row (quantize.h).
  uint8_t* out_fp8 = nullptr;
  int64_t out_fp8_row_stride = 0;
  float* out_fp8_scale = nullptr;  // [rows]
};

ValidationError validate(const NormParams& p);

// Plain CPU implementation: the oracle for tests and the CPU dispatch of the torch ops.
void reference(const NormParams& p);

// How the CUDA launcher maps rows to threads; exposed so tests can check the planning.
constexpr int kMaxCachedThreads = 256;  // per block, also when rows share a block
constexpr int kMaxItems = 8;
constexpr int kMaxStreamedThreads = 1024;
struct NormLaunchPlan {
  int vec = 1;              // elements per vector access (16 bytes when aligned, else 1)
  int items = 0;            // vectors kept in registers per thread; 0 = row too long, re-read
  int threads_per_row = 32; // 32, 64, 128 or 256 when items > 0, else 1024
  int rows_per_block = 1;
  int64_t blocks = 0;
};
NormLaunchPlan plan_norm(const NormParams& p);

#ifdef LTX_KERNELS_WITH_CUDA
cudaError_t launch(const NormParams& p, cudaStream_t stream);
#endif

}  // namespace ltx_kernels

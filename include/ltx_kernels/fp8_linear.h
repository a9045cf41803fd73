// FP8 linear: the GEMM of two row-quantized e4m3 operands (quantize.h's format), the product
// of the FP8 linear path (DESIGN.md section 6). Exactly:
//   acc[m, n] = sum_k a[m, k] * b[n, k]                 (e4m3 values, fp32 accumulation)
//   out[m, n] = (acc[m, n] * a_scale[m]) * b_scale[n] + bias[n]    (fp32), rounded once
// with a = the activations [m, k] (one scale per token) and b = the weight [n, k] (one scale
// per output channel). The tensor cores' FP8 accumulator is not plain fp32 (a product of
// e4m3 values is exact, the running sum is truncated), so the GPU is held to the reference
// with a tolerance that grows with k.
//
// With a gated residual (fp8_linear_gated_residual: a DiT block's attention output and
// feed-forward down projections, written straight into the residual stream):
//   out[m, n] = residual[m, n] + gate[m / batch_rows, n] * (the above)   (fp32), rounded once
// residual and gate in out_dtype; one gate row per batch of batch_rows consecutive rows (the
// AdaLN gate of a [B, S, N] activation: batch_rows = S). No gate (nullptr): a gate of ones,
// out = residual + the above (an ungated residual, e.g. LTX's text cross-attention).
//
// With activation kGeluTanh (a feed-forward's up projection; not with the gated residual):
//   out[m, n] = gelu_tanh(the above)                   (fp32), rounded once
// the GPU computing the fast form of core/activation.cuh (~1e-6 relative to the reference's).
#pragma once

#include <cstdint>

#include "ltx_kernels/quantize.h"
#include "ltx_kernels/types.h"

#if defined(LTX_KERNELS_WITH_CUDA) && defined(LTX_KERNELS_SM90A)
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

struct Fp8LinearParams {
  DType out_dtype = DType::kBFloat16;  // also bias's dtype
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;

  const uint8_t* a = nullptr;  // [m, k] e4m3 bytes, row stride a_row_stride
  int64_t a_row_stride = 0;
  const uint8_t* b = nullptr;  // [n, k] e4m3 bytes, row stride b_row_stride
  int64_t b_row_stride = 0;
  const float* a_scale = nullptr;  // [m]
  const float* b_scale = nullptr;  // [n]
  const void* bias = nullptr;      // [n] in out_dtype, or nullptr
  void* out = nullptr;             // [m, n], row stride out_row_stride
  int64_t out_row_stride = 0;
  // The gated residual: a residual, and a gate or none (ones); no gate without a residual.
  const void* residual = nullptr;  // [m, n], row stride residual_row_stride
  int64_t residual_row_stride = 0;
  const void* gate = nullptr;      // [m / batch_rows, n], row stride gate_batch_stride, or nullptr
  int64_t gate_batch_stride = 0;
  int64_t batch_rows = 0;          // rows per gate row, > 0 and dividing m
  Fp8Activation activation = Fp8Activation::kNone;
  // Compute capability of the GPU it runs on (major * 10 + minor): the CUDA kernel is Hopper's.
  int32_t arch = 0;
};

ValidationError validate(const Fp8LinearParams& p);

// Plain CPU implementation of the definition above (sequential fp32 sums): the oracle of the
// CUDA kernel and the CPU dispatch.
void reference(const Fp8LinearParams& p);

// What the CUDA kernel (sm_90a, TMA) supports beyond validate(): a build for sm_90a and an
// sm_90 GPU, bf16 or fp16 out, k a multiple of 16 and n of 8, every row 16-byte aligned (base
// pointers and row strides; the gate's rows too). nullptr when it does.
ValidationError cuda_support(const Fp8LinearParams& p);

#if defined(LTX_KERNELS_WITH_CUDA) && defined(LTX_KERNELS_SM90A)
// Bytes of device scratch launch() needs (the persistent tile scheduler's).
int64_t workspace_bytes(const Fp8LinearParams& p);

cudaError_t launch(const Fp8LinearParams& p, void* workspace, cudaStream_t stream);
#endif

}  // namespace ltx_kernels

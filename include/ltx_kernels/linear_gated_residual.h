// linear_gated_residual: a DiT block's residual update written by the GEMM before it (the
// attention's output projection, the feed-forward's down projection), in 16 bits:
//   acc[m, n] = sum_k a[m, k] * b[n, k]                                   (fp32 accumulation)
//   out[m, n] = residual[m, n] + gate[m / batch_rows, n] * (acc[m, n] + bias[n])
// in fp32, rounded once to dtype; a = the activations [m, k], b = the weight [n, k], every
// tensor in dtype. One gate row per batch of batch_rows consecutive rows (the AdaLN gate of a
// [B, S, N] activation: batch_rows = S); no gate (nullptr): ones, out = residual + the linear.
// What it replaces, linear then gated_residual, rounds the linear's output to dtype first and
// reads and writes it once more (fp8_linear.h's gated residual is the same epilogue after an
// FP8 GEMM).
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

#if defined(LTX_KERNELS_WITH_CUDA) && defined(LTX_KERNELS_SM90A)
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

struct LinearGatedResidualParams {
  DType dtype = DType::kBFloat16;  // of every tensor
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;

  const void* a = nullptr;  // [m, k], row stride a_row_stride
  int64_t a_row_stride = 0;
  const void* b = nullptr;  // [n, k], row stride b_row_stride
  int64_t b_row_stride = 0;
  const void* bias = nullptr;  // [n], or nullptr
  void* out = nullptr;         // [m, n], row stride out_row_stride
  int64_t out_row_stride = 0;
  const void* residual = nullptr;  // [m, n], row stride residual_row_stride
  int64_t residual_row_stride = 0;
  const void* gate = nullptr;  // [m / batch_rows, n], row stride gate_batch_stride, or nullptr
  int64_t gate_batch_stride = 0;
  int64_t batch_rows = 0;  // rows per gate row, > 0 and dividing m
  // Compute capability of the GPU it runs on (major * 10 + minor): the CUDA kernel is Hopper's.
  int32_t arch = 0;
};

ValidationError validate(const LinearGatedResidualParams& p);

// Plain CPU implementation of the definition above (sequential fp32 sums in k order): the
// oracle of the CUDA kernel.
void reference(const LinearGatedResidualParams& p);

// What the CUDA kernel (CUTLASS 3, sm_90a, TMA) supports beyond validate(): a build for sm_90a
// and an sm_90 GPU, bfloat16 or float16, k and n multiples of 8, every row 16-byte aligned
// (base pointers and row strides; the gate's rows too). nullptr when it does.
ValidationError cuda_support(const LinearGatedResidualParams& p);

#if defined(LTX_KERNELS_WITH_CUDA) && defined(LTX_KERNELS_SM90A)
// Bytes of device scratch launch() needs (the persistent tile scheduler's).
int64_t workspace_bytes(const LinearGatedResidualParams& p);

cudaError_t launch(const LinearGatedResidualParams& p, void* workspace, cudaStream_t stream);
#endif

}  // namespace ltx_kernels

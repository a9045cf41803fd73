// Group normalization (a UNet's GroupNorm, and its GroupNorm + SiLU), over x seen as
// [batch, channels, spatial] (spatial = the product of the dims after the channel dim), in one
// of the two layouts a torch tensor has: channels first ([N, C, S] contiguous, NCHW) or
// channels last ([N, S, C] contiguous, NHWC); out has x's layout. fp32 math, rounded once:
//   h   = x + add[n, c]                        (add optional: a ResNet block's time embedding)
//   y   = (h - mean_g) * rsqrt(var_g + eps) * weight[c] + bias[c]
//   out = silu(y) if silu else y
// with mean_g and var_g (biased) over the channels of group g = c / (C / groups) of sample n
// and every spatial position. h is not rounded to dtype: the add is part of the norm.
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

struct GroupNormParams {
  DType dtype = DType::kFloat32;         // of x, add and out
  DType weight_dtype = DType::kFloat32;  // of weight and bias: dtype or float32
  int64_t batch = 0;
  int64_t channels = 0;
  int64_t spatial = 0;
  int64_t groups = 1;  // divides channels
  bool channels_last = false;
  float eps = 1e-5f;
  bool silu = false;

  const void* x = nullptr;       // [N, C, S] or [N, S, C], contiguous
  const void* add = nullptr;     // [N, C] contiguous, optional
  const void* weight = nullptr;  // [C], optional (1)
  const void* bias = nullptr;    // [C], optional (0)
  void* out = nullptr;           // x's layout, contiguous
};

ValidationError validate(const GroupNormParams& p);

// Plain CPU implementation (statistics in double): the oracle for tests and the CPU dispatch.
void reference(const GroupNormParams& p);

#ifdef LTX_KERNELS_WITH_CUDA
// fp32 scratch the CUDA launcher needs (per-channel partial statistics and coefficients).
int64_t workspace_floats(const GroupNormParams& p);
cudaError_t launch(const GroupNormParams& p, float* workspace, cudaStream_t stream);
#endif

}  // namespace ltx_kernels

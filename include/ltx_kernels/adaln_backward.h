// The backward of the AdaLN RMS norms, one pass per row (adaln_rms_norm and
// gated_residual_adaln_rms_norm, src/torch/norm_backward.cpp). Their forward:
//   h      = x                                     (adaln_rms_norm)
//   h      = round(x + y * gate)                   (gated: gate optional, h rounded to dtype)
//   normed = h * rstd * weight * (1 + scale) + shift,   rstd = 1 / sqrt(mean(h^2) + eps)
// From g (the gradient of normed) and, gated, g_h (of the returned h), per row in fp32:
//   xhat = h * rstd;  dn = g * (1 + scale);  dxhat = dn * weight
//   dh   = rstd * (dxhat - xhat * mean(dxhat * xhat)) + g_h
//   dx   = round(dh);  dy = round(dh * gate)                       (gated)
// and the elementwise terms of the broadcast arguments' gradients, in fp32, which the caller
// sums over the rows that share the argument (per batch, or all rows):
//   gn = g * xhat * weight (scale's),  dw = dn * xhat (weight's),  dg = dh * y (gate's).
// (shift's gradient is g summed: nothing to compute here.) Each output is rounded once.
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

struct AdalnBackwardParams {
  DType dtype = DType::kFloat32;  // of x, y, gate, scale, grad_out, grad_h, dx, dy
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 1e-6f;
  int64_t tokens = 1;  // rows per batch, for the RowVectors (rows a multiple of it)

  const void* x = nullptr;  // [rows, cols], row strides in elements
  int64_t x_row_stride = 0;
  const void* y = nullptr;  // gated: the branch added to x; null for the plain norm
  int64_t y_row_stride = 0;
  RowVectors gate;   // gated, optional
  RowVectors scale;  // required
  const float* weight = nullptr;  // [cols] fp32, optional
  const void* grad_out = nullptr;  // g
  int64_t grad_out_row_stride = 0;
  const void* grad_h = nullptr;  // gated: g_h, required with y
  int64_t grad_h_row_stride = 0;

  void* dx = nullptr;  // [rows, cols]
  int64_t dx_row_stride = 0;
  void* dy = nullptr;  // gated, required with y
  int64_t dy_row_stride = 0;
  float* gn = nullptr;  // [rows, cols] contiguous, required
  float* dw = nullptr;  // [rows, cols] contiguous, with weight only
  float* dg = nullptr;  // [rows, cols] contiguous, with gate only
};

ValidationError validate(const AdalnBackwardParams& p);

// Plain CPU implementation: the oracle and the CPU dispatch.
void reference(const AdalnBackwardParams& p);

// Elements per access: 16 bytes of the dtype when every pointer and stride allows, else 1.
int adaln_backward_vector(const AdalnBackwardParams& p);

#ifdef LTX_KERNELS_WITH_CUDA
cudaError_t launch(const AdalnBackwardParams& p, cudaStream_t stream);
#endif

}  // namespace ltx_kernels

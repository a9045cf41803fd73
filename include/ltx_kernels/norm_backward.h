// Fused CUDA backward of rms_norm, fused_add_rms_norm and layer_norm (the forms LLM training
// runs; norm.h has the forward). For each row of a [rows, cols] matrix, from the forward's
// input and the output's gradient dy, with w = weight + weight_offset (1 without a weight):
//   h     = x (for fused_add_rms_norm its new_residual: the rounded sum it normalized)
//   xhat  = norm(h)                      (the row statistics recomputed, not saved)
//   dx    = d loss / d h through y = xhat * w + bias, plus grad_new_residual when given
//   dw    = sum over rows of dy * xhat,  dbias = sum over rows of dy
// in fp32, dx rounded once, written once (fused_add_rms_norm's residual has x's gradient:
// autograd hands the one tensor to both, gradient_is in src/torch/registration.h). dw and dbias
// are reduced per block in fp32 (block i writes row i of dweight_partial / dbias_partial,
// [blocks, cols]), then the partial rows are
// summed in block order by a second kernel that writes dweight / dbias in the weight's dtype:
// no atomics, so the result does not depend on the order blocks finish. The CPU reference is
// the ATen composition of src/torch/norm_backward.cpp, which also serves rows too long for
// this kernel (norm_backward_supported).
#pragma once

#include <cstdint>

#include "ltx_kernels/norm.h"
#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

struct NormBackwardParams {
  NormType type = NormType::kRms;
  DType dtype = DType::kFloat32;  // of x, grad_out, grad_new_residual, out
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 1e-6f;

  const void* x = nullptr;  // [rows, cols], row strides in elements
  int64_t x_row_stride = 0;
  const void* grad_out = nullptr;  // dy
  int64_t grad_out_row_stride = 0;
  const void* grad_new_residual = nullptr;  // optional (RMS only): added to dx
  int64_t grad_new_residual_row_stride = 0;
  const void* weight = nullptr;  // [cols] optional, in weight_dtype (dtype or float32)
  DType weight_dtype = DType::kFloat32;  // of weight, bias (absent here: only its gradient), dweight, dbias
  float weight_offset = 0.0f;

  void* out = nullptr;  // dx, [rows, cols]
  int64_t out_row_stride = 0;

  int64_t blocks = 1;                // CUDA blocks, each its own partial row
  float* dweight_partial = nullptr;  // [blocks, cols] fp32 scratch, with weight
  void* dweight = nullptr;           // [cols], with weight
  float* dbias_partial = nullptr;    // [blocks, cols] fp32 scratch, layer norm with a bias only
  void* dbias = nullptr;             // [cols], with dbias_partial
};

ValidationError validate(const NormBackwardParams& p);

// Whether the kernel takes these rows: a row must fit in registers (up to 2048 vectors of
// 16 bytes, or 2048 elements when a pointer or stride is not 16-byte aligned).
bool norm_backward_supported(const NormBackwardParams& p);

#ifdef LTX_KERNELS_WITH_CUDA
cudaError_t launch(const NormBackwardParams& p, cudaStream_t stream);
#endif

}  // namespace ltx_kernels

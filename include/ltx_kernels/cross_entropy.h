// The two row passes of fused_linear_cross_entropy (src/torch/cross_entropy.cpp), each over one
// chunk of the vocabulary: classes [class0, class0 + cols) of every row, whose fp32 logits
// [rows, cols] the GEMM just wrote. With bias, each logit is logits[r, j] + bias[j] (fp32 sum;
// bias points at the chunk's first class).
//
// Stats, per row, carried from chunk to chunk (the online softmax's max and sum):
//   M          = max(row_max[r], max_j l_j)                (NaN logits ignored by the max)
//   row_sum[r] = row_sum[r] * exp(row_max[r] - M) + sum_j exp(l_j - M)   (0 while M is -inf)
//   row_max[r] = M;  picked[r] = l_{target[r] - class0} when target[r] lies in the chunk
// so that after the last chunk lse = row_max + log(row_sum) and the loss is lse - picked. A
// NaN logit makes the row's sum, hence its loss, NaN.
//
// Grad, per element (the gradient of a*lse - b*l_target, a and b per row):
//   grad[r, j] = exp(l_j - lse[r]) * softmax_weight[r] - (class0 + j == target[r]) * target_weight[r]
// computed in fp32 and rounded once to grad's dtype.
//
// target[r] < 0 means no class (an ignored token): the caller maps ignore_index to -1.
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

struct CrossEntropyChunk {
  int64_t rows = 0;
  int64_t cols = 0;  // classes in the chunk
  const float* logits = nullptr;  // [rows, cols], row stride logits_row_stride (elements)
  int64_t logits_row_stride = 0;
  DType bias_dtype = DType::kFloat32;
  const void* bias = nullptr;      // [cols] or null
  const int64_t* target = nullptr;  // [rows], contiguous
  int64_t class0 = 0;
};

struct CrossEntropyStatsParams {
  CrossEntropyChunk chunk;
  float* row_max = nullptr;  // [rows], in and out
  float* row_sum = nullptr;  // [rows], in and out
  float* picked = nullptr;   // [rows], written for the rows whose target is in the chunk
};

struct CrossEntropyGradParams {
  CrossEntropyChunk chunk;
  const float* lse = nullptr;             // [rows]
  const float* softmax_weight = nullptr;  // [rows]
  const float* target_weight = nullptr;   // [rows]
  DType grad_dtype = DType::kFloat32;
  void* grad = nullptr;  // [rows, cols], row stride grad_row_stride (elements)
  int64_t grad_row_stride = 0;
};

ValidationError validate(const CrossEntropyStatsParams& p);
ValidationError validate(const CrossEntropyGradParams& p);

// Plain CPU implementations (sums in order; the kernels' sums are in another order, so the
// two agree to fp32 rounding, not bit for bit).
void reference(const CrossEntropyStatsParams& p);
void reference(const CrossEntropyGradParams& p);

// Elements per access: 4 when every pointer and stride allows 4-element vectors, else 1.
int cross_entropy_vector(const CrossEntropyStatsParams& p);
int cross_entropy_vector(const CrossEntropyGradParams& p);

#ifdef LTX_KERNELS_WITH_CUDA
cudaError_t launch(const CrossEntropyStatsParams& p, cudaStream_t stream);
cudaError_t launch(const CrossEntropyGradParams& p, cudaStream_t stream);
#endif

}  // namespace ltx_kernels

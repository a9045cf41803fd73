// How the fused norm backward maps rows to threads (norm_backward.cpp), shared with its
// launcher (norm_backward.cu).
#pragma once

#include "ltx_kernels/norm_backward.h"

namespace ltx_kernels {

constexpr int kNormBackwardThreads = 256;  // per block
constexpr int kNormBackwardMaxItems = 8;   // vectors held in registers per thread

struct NormBackwardPlan {
  int vec = 1;              // elements per access: 16 bytes when every pointer and stride allows it
  int threads_per_row = 32; // 32 (8 rows a block) or kNormBackwardThreads
  int items = 1;            // vectors per thread; 0: the row does not fit
};

NormBackwardPlan plan_norm_backward(const NormBackwardParams& p);

}  // namespace ltx_kernels

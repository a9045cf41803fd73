// The short-key attention kernel, attention_short.cu: every key of a (batch, head) held in
// shared memory, for cross-attention against a text encoder's few tokens (LTX: 128).
#pragma once

#include <cuda_runtime_api.h>

#include "ltx_kernels/attention.h"

namespace ltx_kernels {

// Runs p (uses_short_kernel(p)); no workspace.
cudaError_t launch_short(const AttentionParams& p, cudaStream_t stream);

}  // namespace ltx_kernels

// The decode attention kernel, attention_decode.cu: a few query rows per kv head against many
// keys, the keys split across CTAs (ops/attention_workspace.h: uses_decode_kernel).
#pragma once

#include <cuda_runtime_api.h>

#include "ltx_kernels/attention.h"

namespace ltx_kernels {

// Runs p (uses_decode_kernel(p)) with its workspace (attention_workspace: the chunks' partial
// results).
cudaError_t launch_decode(const AttentionParams& p, void* workspace, cudaStream_t stream);

}  // namespace ltx_kernels

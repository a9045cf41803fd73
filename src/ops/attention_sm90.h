// The Hopper (sm_90a) attention kernel, attention_sm90.cu: wgmma with operands in shared memory.
// Built only for sm_90a (LTX_KERNELS_SM90A).
#pragma once

#include <cuda_runtime_api.h>

#include "ltx_kernels/attention.h"
#include "ops/attention_workspace.h"

namespace ltx_kernels {

// Runs the kernel; for the 8-bit method q and k must already be quantized into w. Requires
// uses_hopper_kernel(p).
cudaError_t launch_hopper(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream);

// The short-key kernel's Hopper form (uses_short_kernel(p), an sm_90 GPU); no workspace.
cudaError_t launch_short_hopper(const AttentionParams& p, cudaStream_t stream);

}  // namespace ltx_kernels

// The norm family's CUDA launch, split by dtype so that its many kernel instantiations compile
// in parallel: launch_typed<T, W, O> (x and the residuals in T, weight and bias in W, out in O)
// is defined in norm_kernels.cuh and instantiated in norm_<dtype of x>.cu, for W = O = T and,
// for a 16-bit T, the mixed-precision forms (W, O) = (float, T) and (float, float) that
// validate() allows; launch() in norm.cu picks one.
#pragma once

#include <cuda_runtime_api.h>

#include "ltx_kernels/norm.h"

namespace ltx_kernels::norm_cuda {

template <typename T, typename W, typename O>
cudaError_t launch_typed(const NormParams& p, const NormLaunchPlan& plan, cudaStream_t stream);

}  // namespace ltx_kernels::norm_cuda

// The norm kernels for float32 inputs (norm_launch.h).
#include "ops/norm_kernels.cuh"

namespace ltx_kernels::norm_cuda {

template cudaError_t launch_typed<float, float, float>(const NormParams&, const NormLaunchPlan&,
                                                       cudaStream_t);

}  // namespace ltx_kernels::norm_cuda

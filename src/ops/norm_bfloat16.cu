// The norm kernels for bfloat16 inputs (norm_launch.h).
#include "ops/norm_kernels.cuh"

namespace ltx_kernels::norm_cuda {

template cudaError_t launch_typed<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>(const NormParams&, const NormLaunchPlan&,
                                                                               cudaStream_t);
template cudaError_t launch_typed<__nv_bfloat16, float, __nv_bfloat16>(const NormParams&, const NormLaunchPlan&,
                                                                       cudaStream_t);
template cudaError_t launch_typed<__nv_bfloat16, float, float>(const NormParams&, const NormLaunchPlan&,
                                                               cudaStream_t);

}  // namespace ltx_kernels::norm_cuda

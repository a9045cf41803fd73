// The norm kernels for float16 inputs (norm_launch.h).
#include "ops/norm_kernels.cuh"

namespace ltx_kernels::norm_cuda {

template cudaError_t launch_typed<__half, __half, __half>(const NormParams&, const NormLaunchPlan&,
                                                          cudaStream_t);
template cudaError_t launch_typed<__half, float, __half>(const NormParams&, const NormLaunchPlan&,
                                                         cudaStream_t);
template cudaError_t launch_typed<__half, float, float>(const NormParams&, const NormLaunchPlan&,
                                                        cudaStream_t);

}  // namespace ltx_kernels::norm_cuda

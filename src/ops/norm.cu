// CUDA launcher of the norm family (see include/ltx_kernels/norm.h): validation, the launch
// plan, and the kernels of the params' dtypes (norm_kernels.cuh, compiled per dtype).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/norm_launch.h"

namespace ltx_kernels {
namespace {

using norm_cuda::launch_typed;

// A 16-bit T with its mixed-precision forms (float weight; float weight and out: validate).
template <typename T>
cudaError_t launch_16bit(const NormParams& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  if (p.out_dtype == DType::kFloat32) return launch_typed<T, float, float>(p, plan, stream);
  if (p.weight_dtype == DType::kFloat32) return launch_typed<T, float, T>(p, plan, stream);
  return launch_typed<T, T, T>(p, plan, stream);
}

}  // namespace

cudaError_t launch(const NormParams& p, cudaStream_t stream) {
  if (validate(p) != nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const NormLaunchPlan plan = plan_norm(p);
  switch (p.dtype) {
    case DType::kFloat32: return launch_typed<float, float, float>(p, plan, stream);
    case DType::kFloat16: return launch_16bit<__half>(p, plan, stream);
    case DType::kBFloat16: return launch_16bit<__nv_bfloat16>(p, plan, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx_kernels

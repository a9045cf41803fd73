// Activations in fp32 for device code, shared by the elementwise kernels and the fused
// activation + FP8 quantization.
#pragma once

namespace ltx_kernels::core {

// 0.5 x (1 + tanh(u)) == x * sigmoid(2u): one fast exp and a fast division instead of
// tanhf, whose instruction count kept the kernels from memory speed. Relative error ~1e-6;
// the limits are right (exp overflows to inf and x / inf is 0 for large negative x).
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kTwoSqrt2OverPi = 1.5957691216057308f;
  const float two_u = kTwoSqrt2OverPi * (x + 0.044715f * x * x * x);
  return __fdividef(x, 1.0f + __expf(-two_u));
}

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

// x * sigmoid(x) with the fast exp and division (same accuracy argument as gelu_tanh).
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

}  // namespace ltx_kernels::core

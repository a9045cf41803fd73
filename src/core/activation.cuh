// Activations in fp32 for device code, shared by the elementwise kernels and the fused
// activation + FP8 quantization.
#pragma once

namespace ltx_kernels::core {

// log2(e): the attention kernels take their scores to log2 units (exp(x) = exp2(x log2 e)), so
// that the softmax's exponentials are fast_exp2 / exp2f.
constexpr float kLog2e = 1.4426950408889634f;

// 2^x by the SFU (ex2.approx: 2 ulp; exp2(-inf) = 0; results below fp32's smallest normal
// flush to 0): the attention kernels' softmax, where P is rounded to 16 bits afterwards.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x by the SFU (rcp.approx.ftz: 1 ulp; results below fp32's smallest normal flush to 0).
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// x / (1 + 2^t) by the SFU, right wherever the result is a normal fp32 number: h = 2^(-|t|/2)
// lies in (0, 1], so the divisor 1 + h^2 stays in [1, 2], and for t > 0 the numerator x 2^-t
// is formed as (x h) h, which stays right after 2^-t itself has gone below fp32's smallest
// normal. ex2.approx.ftz and rcp.approx.ftz (2 and 1 ulp; relative error ~5e-7) are one SASS
// instruction each: x_sigmoid is 9 instructions and gelu_tanh 11 on sm_90a, where __expf and
// __fdividef's denormal handling made them 15 and 19. In the FP8 up projection's GELU epilogue,
// where the GEMM runs at the power cap, the count shows in the time (benchmarks/results/h100/
// gemm.md).
__device__ __forceinline__ float x_over_one_plus_exp2(float x, float t) {
  const float h = fast_exp2(-0.5f * fabsf(t));
  return (t > 0.0f ? x * h * h : x) * fast_rcp(fmaf(h, h, 1.0f));
}

// x * sigmoid(z) = x / (1 + e^-z).
__device__ __forceinline__ float x_sigmoid(float x, float z) { return x_over_one_plus_exp2(x, -kLog2e * z); }

// 0.5 x (1 + tanh(u)) == x * sigmoid(2u) == x / (1 + 2^(-2 u log2 e)), u = sqrt(2/pi) (x +
// 0.044715 x^3), the constants folded into the polynomial: no cancellation in 1 + tanh for
// negative x.
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kC0 = -2.0f * 0.7978845608028654f * kLog2e;
  constexpr float kC1 = kC0 * 0.044715f;
  return x_over_one_plus_exp2(x, x * fmaf(kC1, x * x, kC0));
}

// 0.5 x erfc(-x / sqrt 2) == 0.5 x (1 + erf(x / sqrt 2)) without the cancellation of 1 + erf
// below x = -4, where the erf form gives 0 instead of e.g. -1.5e-5 at x = -4.5.
__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * erfcf(-x * 0.7071067811865476f);
}

__device__ __forceinline__ float silu(float x) { return x_sigmoid(x, x); }

// An activation of the form x * sigmoid(z(x)) or x * Phi(x), and its derivative, for the
// backward kernels (the value is the gradient of the other factor of a GLU).
struct ValueAndSlope {
  float value, slope;
};

// x * s and d/dx = s + x s (1 - s) z'(x), with s = sigmoid(z) and 1 - s both formed from
// h^2 = e^-|z|: whichever is small is h^2 / (1 + h^2), never 1 - (~1),
// so neither cancels, and both are 0 / 1 rather than NaN once e^-|z| underflows. dz = z'(x).
__device__ __forceinline__ ValueAndSlope x_sigmoid_and_slope(float x, float z, float dz) {
  // (the SFU's ftz forms, as x_over_one_plus_exp2: 1 + q is in [1, 2], and h only flushes
  // to 0 past |z| > 175, where q is below fp32's normal range either way)
  const float h = fast_exp2(-0.5f * kLog2e * fabsf(z));
  const float q = h * h;
  const float big = fast_rcp(1.0f + q);
  const float small = q * big;
  const float s = z >= 0.0f ? big : small;
  const float one_minus_s = z >= 0.0f ? small : big;
  // Past |x| ~ 1.8e19 GELU's dz overflows where s (1 - s) is already 0: 0 * inf must not
  // turn the slope (s) into NaN.
  const float t = x * s * one_minus_s;
  return {x * s, t == 0.0f ? s : fmaf(t, dz, s)};
}

__device__ __forceinline__ ValueAndSlope gelu_tanh_and_slope(float x) {
  constexpr float kTwoSqrt2OverPi = 1.5957691216057308f;
  constexpr float kC = 0.044715f;
  const float x2 = x * x;
  return x_sigmoid_and_slope(x, kTwoSqrt2OverPi * fmaf(kC * x2, x, x), kTwoSqrt2OverPi * fmaf(3.0f * kC, x2, 1.0f));
}

// Phi(x) + x phi(x), phi the standard normal density.
__device__ __forceinline__ ValueAndSlope gelu_and_slope(float x) {
  constexpr float kInvSqrt2Pi = 0.3989422804014327f;
  const float phi_cdf = 0.5f * erfcf(-x * 0.7071067811865476f);
  return {x * phi_cdf, fmaf(x * kInvSqrt2Pi, __expf(-0.5f * x * x), phi_cdf)};
}

__device__ __forceinline__ ValueAndSlope silu_and_slope(float x) { return x_sigmoid_and_slope(x, x, 1.0f); }

}  // namespace ltx_kernels::core

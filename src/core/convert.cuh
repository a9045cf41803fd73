// fp32 <-> storage dtype conversion for device code. Math is always fp32; these are the
// only places a value is widened or rounded (round-to-nearest-even).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace ltx_kernels::core {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Two 16-bit values packed in a 32-bit word (the first in the low half), widened or rounded
// together: the same values and rounding as to_float / from_float on each, with the pair kept
// in one register (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32 round two floats in one instruction).
template <typename T>
__device__ __forceinline__ float2 pair_to_float2(unsigned int word) {
  static_assert(sizeof(T) == 2);
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h;
    memcpy(&h, &word, sizeof(h));
    return __half22float2(h);
  } else {
    return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
  }
}
template <typename T>
__device__ __forceinline__ unsigned int pair_from_floats(float lo, float hi) {
  static_assert(sizeof(T) == 2);
  unsigned int word;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&word, &h, sizeof(word));
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&word, &h, sizeof(word));
  }
  return word;
}

// Value after a round trip through T: what a stored-then-reloaded value would be.
template <typename T>
__device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

}  // namespace ltx_kernels::core

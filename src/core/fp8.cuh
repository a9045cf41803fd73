// quantize.h's FP8 row format on the device, shared by every kernel that writes it
// (quantize_fp8, the norms' FP8 outputs): IEEE divisions and an unfused product, so the bytes
// equal the CPU reference's (reference/fp8.h).
#pragma once

#include <cuda_fp8.h>

#include "core/reduce.cuh"
#include "core/vec.cuh"
#include "ltx_kernels/quantize.h"

namespace ltx_kernels::core {

// The row's scale (amax / 448) and its inverse for the elements (448 / amax), amax clamped
// to kMinAmax (a zero row); NaN propagates.
struct Fp8Row {
  float inv;
  float scale;
};
__device__ __forceinline__ Fp8Row fp8_row(float amax) {
  amax = NanMax{}(amax, kMinAmax);
  return {__fdiv_rn(kFp8E4m3Max, amax), __fdiv_rn(amax, kFp8E4m3Max)};
}

template <int N>
__device__ __forceinline__ void absmax_into(float& amax, const Floats<N>& f) {
#pragma unroll
  for (int j = 0; j < N; ++j) amax = NanMax{}(amax, fabsf(f.v[j]));
}

// Two elements per F2FP (the e4m3x2 conversion: the same rounding as one at a time), four
// bytes assembled as one word, so that the bytes need no shuffling before the store.
__device__ __forceinline__ uint32_t e4m3x2(float a, float b, float inv) {
  return __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(a, inv), __fmul_rn(b, inv)), __NV_SATFINITE, __NV_E4M3);
}

template <int N>
__device__ __forceinline__ Vec<uint8_t, N> to_e4m3(const Floats<N>& f, float inv) {
  Vec<uint8_t, N> q;
  int j = 0;
#pragma unroll
  for (; j + 3 < N; j += 4) {
    // (memory order: the first element in the low byte)
    const uint32_t word = e4m3x2(f.v[j], f.v[j + 1], inv) | e4m3x2(f.v[j + 2], f.v[j + 3], inv) << 16;
    memcpy(&q.v[j], &word, 4);
  }
#pragma unroll
  for (; j < N; ++j) q.v[j] = __nv_cvt_float_to_fp8(__fmul_rn(f.v[j], inv), __NV_SATFINITE, __NV_E4M3);
  return q;
}

}  // namespace ltx_kernels::core

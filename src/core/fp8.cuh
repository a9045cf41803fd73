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

template <int N>
__device__ __forceinline__ Vec<uint8_t, N> to_e4m3(const Floats<N>& f, float inv) {
  Vec<uint8_t, N> q;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    q.v[j] = __nv_cvt_float_to_fp8(__fmul_rn(f.v[j], inv), __NV_SATFINITE, __NV_E4M3);
  }
  return q;
}

}  // namespace ltx_kernels::core

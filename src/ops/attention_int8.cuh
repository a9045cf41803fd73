// The 8-bit attention method's INT8 rounding of one block of q or k (kQuantBlock rows of one
// head): one scale amax / 127 for the block, each element x rounded to the nearest integer of
// x * 127 / amax (ties to even), in [-127, 127], as the CPU reference (src/reference/
// attention.cpp) rounds: the quantization pass (attention.cu) and the Hopper kernel's own q
// rounding (attention_sm90.cu) both use these, so that every path gives the same bytes.
#pragma once

#include <cstdint>

#include "core/reduce.cuh"
#include "ltx_kernels/quantize.h"  // kMinAmax

namespace ltx_kernels::int8_block {

// The amax a block's scale is taken from: a zero block gets kMinAmax; NaN propagates.
__device__ __forceinline__ float amax_of(float amax) { return (amax > kMinAmax || amax != amax) ? amax : kMinAmax; }
__device__ __forceinline__ float scale_of(float amax) { return __fdiv_rn(amax, 127.0f); }
__device__ __forceinline__ float inverse_of(float amax) { return __fdiv_rn(127.0f, amax); }

// Eight elements rounded (see above) and packed as 8 bytes, element 0 in the lowest.
__device__ __forceinline__ uint2 pack8(const float (&v)[8], float inverse) {
  uint32_t packed[2] = {0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int q = min(max(__float2int_rn(__fmul_rn(v[e], inverse)), -127), 127);
    packed[e / 4] |= static_cast<uint32_t>(q & 0xff) << (8 * (e % 4));
  }
  return make_uint2(packed[0], packed[1]);
}

}  // namespace ltx_kernels::int8_block

// Sums across the threads that share one row. A block is laid out as
// blockDim.y rows x THREADS_PER_ROW threads per row (== blockDim.x), a multiple of 32.
#pragma once

namespace ltx_kernels::core {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

constexpr int kMaxWarpsPerBlock = 32;

// Sum of v over the THREADS_PER_ROW threads of row group threadIdx.y, returned to each of
// them. Every thread of the block must call it (it synchronizes the block). `scratch`
// holds kMaxWarpsPerBlock floats; a block that reduces more than once passes a different
// scratch to each call, so that no barrier is needed before it is written again.
template <int THREADS_PER_ROW>
__device__ __forceinline__ float row_sum(float v, float* scratch) {
  static_assert(THREADS_PER_ROW % 32 == 0 && THREADS_PER_ROW <= 32 * kMaxWarpsPerBlock);
  constexpr int kWarps = THREADS_PER_ROW / 32;
  v = warp_sum(v);
  if constexpr (kWarps == 1) {
    return v;
  } else {
    float* row_scratch = scratch + threadIdx.y * kWarps;
    if (threadIdx.x % 32 == 0) row_scratch[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += row_scratch[w];
    return total;
  }
}

}  // namespace ltx_kernels::core

// Sums across the threads that share one row. A block is laid out as
// blockDim.y rows x blockDim.x threads per row, blockDim.x a multiple of 32.
#pragma once

namespace ltx_kernels::core {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

constexpr int kMaxWarpsPerBlock = 32;

// Sum of v over the threadIdx.y row group, returned to every thread of the group.
// Every thread of the block must call it (it synchronizes the block). `scratch` holds
// kMaxWarpsPerBlock floats; a block that reduces more than once passes a different scratch
// to each call, so that no barrier is needed before it is written again. MAX_WARPS bounds
// blockDim.x / 32 so the final sum is unrolled.
template <int MAX_WARPS = kMaxWarpsPerBlock>
__device__ __forceinline__ float row_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warps_per_row = blockDim.x / 32;
  if (warps_per_row == 1) return v;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float* row_scratch = scratch + threadIdx.y * warps_per_row;
  if (lane == 0) row_scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < MAX_WARPS; ++w)
    if (w < warps_per_row) total += row_scratch[w];
  return total;
}

}  // namespace ltx_kernels::core

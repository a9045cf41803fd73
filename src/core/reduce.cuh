// Reductions across the threads that share one row. A block is laid out as
// blockDim.y rows x THREADS_PER_ROW threads per row (== blockDim.x): 8 or 16 (several rows in
// a warp, each in its own aligned group of lanes) or a multiple of 32.
#pragma once

namespace ltx_kernels::core {

struct Sum {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// Max that propagates NaN (fmaxf drops it): a row with a NaN must not look finite.
struct NanMax {
  __device__ __forceinline__ float operator()(float a, float b) const {
    return (a > b || a != a) ? a : b;
  }
};

// op over each aligned group of WIDTH lanes (the whole warp by default). Every lane of the
// warp calls it; xor offsets below WIDTH keep each group's values within the group.
template <int WIDTH = 32, typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

constexpr int kMaxWarpsPerBlock = 32;

// op over v of the THREADS_PER_ROW threads of row group threadIdx.y, returned to each of
// them. Every thread of the block must call it (it synchronizes the block). `scratch`
// holds kMaxWarpsPerBlock floats; a block that reduces more than once passes a different
// scratch to each call, so that no barrier is needed before it is written again.
template <int THREADS_PER_ROW, typename Op>
__device__ __forceinline__ float row_reduce(float v, float* scratch, Op op) {
  static_assert(THREADS_PER_ROW == 8 || THREADS_PER_ROW == 16 ||
                (THREADS_PER_ROW % 32 == 0 && THREADS_PER_ROW <= 32 * kMaxWarpsPerBlock));
  if constexpr (THREADS_PER_ROW < 32) return warp_reduce<THREADS_PER_ROW>(v, op);
  constexpr int kWarps = THREADS_PER_ROW / 32;
  v = warp_reduce(v, op);
  if constexpr (kWarps == 1) {
    return v;
  } else {
    float* row_scratch = scratch + threadIdx.y * kWarps;
    if (threadIdx.x % 32 == 0) row_scratch[threadIdx.x / 32] = v;
    __syncthreads();
    float total = row_scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) total = op(total, row_scratch[w]);
    return total;
  }
}

template <int THREADS_PER_ROW>
__device__ __forceinline__ float row_sum(float v, float* scratch) {
  return row_reduce<THREADS_PER_ROW>(v, scratch, Sum{});
}

}  // namespace ltx_kernels::core

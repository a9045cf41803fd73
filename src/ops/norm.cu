// CUDA kernels and launcher of the norm family (see include/ltx_kernels/norm.h).
//
// A group of threads_per_row threads owns one row. When the row fits (items > 0) it is read
// once into registers and normalized from there: each input byte is read once and each
// output byte written once. Longer rows are streamed twice (three times for layer norm),
// the re-reads mostly hitting L2.
#include <climits>

#include "core/reduce.cuh"
#include "core/vec.cuh"
#include "ltx_kernels/norm.h"

namespace ltx_kernels {
namespace {

using core::Floats;

template <typename T, int N>
struct RowPtrs {
  const T* x;
  const T* residual;
  T* residual_out;
  T* out;
};

template <typename T, int N>
__device__ __forceinline__ RowPtrs<T, N> row_ptrs(const NormParams& p, int64_t row) {
  RowPtrs<T, N> r;
  r.x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  r.residual = p.residual ? static_cast<const T*>(p.residual) + row * p.residual_row_stride
                          : nullptr;
  r.residual_out =
      p.residual_out ? static_cast<T*>(p.residual_out) + row * p.residual_out_row_stride
                     : nullptr;
  r.out = static_cast<T*>(p.out) + row * p.out_row_stride;
  return r;
}

// out = (h - mean) * rstd [* (weight + offset)] [+ bias] for the N elements at column col.
template <typename T, int N>
__device__ __forceinline__ void normalize_store(const NormParams& p, Floats<N> h, int64_t col,
                                                float mean, float rstd, T* out) {
#pragma unroll
  for (int j = 0; j < N; ++j) h.v[j] = (h.v[j] - mean) * rstd;
  if (p.weight) {
    const Floats<N> w = core::load_cached<T, N>(static_cast<const T*>(p.weight) + col);
#pragma unroll
    for (int j = 0; j < N; ++j) h.v[j] *= w.v[j] + p.weight_offset;
  }
  if (p.bias) {
    const Floats<N> b = core::load_cached<T, N>(static_cast<const T*>(p.bias) + col);
#pragma unroll
    for (int j = 0; j < N; ++j) h.v[j] += b.v[j];
  }
  core::store<T, N>(out + col, h);
}

// Row held in registers: ITEMS vectors of N elements per thread.
template <typename T, int N, int ITEMS>
__global__ void __launch_bounds__(kMaxCachedThreads) norm_cached_kernel(const NormParams p) {
  __shared__ float scratch[core::kMaxWarpsPerBlock];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool active = row < p.rows;
  const int64_t nvec = p.cols / N;
  const RowPtrs<T, N> r = row_ptrs<T, N>(p, active ? row : 0);

  // Whether vector i of this thread lies in the row (recomputed: an array of flags spills).
  const auto valid = [&](int i) { return active && threadIdx.x + i * blockDim.x < nvec; };
  Floats<N> h[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (valid(i)) {
      h[i] = core::load_stream<T, N>(r.x + (threadIdx.x + i * blockDim.x) * N);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) h[i].v[j] = 0.0f;
    }
  }
  if (r.residual) {
    Floats<N> res[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
      if (valid(i))
        res[i] = core::load_stream<T, N>(r.residual + (threadIdx.x + i * blockDim.x) * N);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (!valid(i)) continue;
      // Normalize exactly the value that is stored as the new residual.
#pragma unroll
      for (int j = 0; j < N; ++j) h[i].v[j] = core::round_to<T>(h[i].v[j] + res[i].v[j]);
      core::store<T, N>(r.residual_out + (threadIdx.x + i * blockDim.x) * N, h[i]);
    }
  }

  const float inv_cols = 1.0f / static_cast<float>(p.cols);
  float mean = 0.0f;
  float sq = 0.0f;
  if (p.type == NormType::kLayer) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
      for (int j = 0; j < N; ++j) sum += h[i].v[j];
    mean = core::row_sum(sum, scratch) * inv_cols;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
      if (valid(i))
#pragma unroll
        for (int j = 0; j < N; ++j) sq += (h[i].v[j] - mean) * (h[i].v[j] - mean);
  } else {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
      for (int j = 0; j < N; ++j) sq += h[i].v[j] * h[i].v[j];
  }
  const float rstd = rsqrtf(core::row_sum(sq, scratch) * inv_cols + p.eps);

#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
    if (valid(i))
      normalize_store<T, N>(p, h[i], (threadIdx.x + static_cast<int64_t>(i) * blockDim.x) * N,
                            mean, rstd, r.out);
}

// Row too long for registers: stream it, re-reading for each pass.
template <typename T, int N>
__global__ void __launch_bounds__(kMaxStreamedThreads) norm_streamed_kernel(const NormParams p) {
  __shared__ float scratch[core::kMaxWarpsPerBlock];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool active = row < p.rows;
  const int64_t nvec = active ? p.cols / N : 0;
  const RowPtrs<T, N> r = row_ptrs<T, N>(p, active ? row : 0);
  // After the first pass the (rounded) input lives here; re-reads see this thread's stores.
  const T* h_src = r.residual ? r.residual_out : r.x;

  float sum = 0.0f;
  float sq = 0.0f;
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    Floats<N> h = core::load_stream<T, N>(r.x + v * N);
    if (r.residual) {
      const Floats<N> res = core::load_stream<T, N>(r.residual + v * N);
#pragma unroll
      for (int j = 0; j < N; ++j) h.v[j] = core::round_to<T>(h.v[j] + res.v[j]);
      core::store<T, N>(r.residual_out + v * N, h);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) {
      sum += h.v[j];
      sq += h.v[j] * h.v[j];
    }
  }
  const float inv_cols = 1.0f / static_cast<float>(p.cols);
  float mean = 0.0f;
  if (p.type == NormType::kLayer) {
    // Two-pass variance: sum of squared deviations, not E[x^2] - mean^2, which cancels.
    mean = core::row_sum(sum, scratch) * inv_cols;
    sq = 0.0f;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      const Floats<N> h = core::load_stream<T, N>(h_src + v * N);
#pragma unroll
      for (int j = 0; j < N; ++j) sq += (h.v[j] - mean) * (h.v[j] - mean);
    }
  }
  const float rstd = rsqrtf(core::row_sum(sq, scratch) * inv_cols + p.eps);
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x)
    normalize_store<T, N>(p, core::load_stream<T, N>(h_src + v * N), v * N, mean, rstd, r.out);
}

template <typename T, int N>
cudaError_t launch_vec(const NormParams& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.blocks));
  const dim3 block(plan.threads_per_row, plan.rows_per_block);
  switch (plan.items) {
    case 0: norm_streamed_kernel<T, N><<<grid, block, 0, stream>>>(p); break;
    case 1: norm_cached_kernel<T, N, 1><<<grid, block, 0, stream>>>(p); break;
    case 2: norm_cached_kernel<T, N, 2><<<grid, block, 0, stream>>>(p); break;
    case 4: norm_cached_kernel<T, N, 4><<<grid, block, 0, stream>>>(p); break;
    case 8:
      if constexpr (N * 8 <= 32) {
        norm_cached_kernel<T, N, 8><<<grid, block, 0, stream>>>(p);
        break;
      }
      return cudaErrorInvalidConfiguration;
    default: return cudaErrorInvalidConfiguration;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const NormParams& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  return plan.vec == kVec ? launch_vec<T, kVec>(p, plan, stream)
                          : launch_vec<T, 1>(p, plan, stream);
}

}  // namespace

cudaError_t launch(const NormParams& p, cudaStream_t stream) {
  if (validate(p) != nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const NormLaunchPlan plan = plan_norm(p);
  if (plan.blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  switch (p.dtype) {
    case DType::kFloat32: return launch_typed<float>(p, plan, stream);
    case DType::kFloat16: return launch_typed<__half>(p, plan, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, plan, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx_kernels

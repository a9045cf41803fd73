// CUDA kernels of the cross-entropy row passes (include/ltx_kernels/cross_entropy.h): a warp per
// row, streaming the chunk's fp32 logits once in 16-byte vectors. The stats pass keeps each
// lane's online (max, sum), rescaling its sum only when a vector raises the max, then merges
// the lanes' pairs and the row's running pair; the grad pass writes each element once.
#include <cmath>
#include <optional>

#include "core/vec.cuh"
#include "ltx_kernels/cross_entropy.h"
#include "ops/host_util.h"

namespace ltx_kernels {
namespace {

using core::Floats;

constexpr int kWarps = 8;  // rows per block

// N logits of the row from element j on, the bias added.
template <typename B, int N>
__device__ __forceinline__ Floats<N> logits_at(const CrossEntropyChunk& c, const float* row, int64_t j) {
  Floats<N> l = core::widen(core::load_stream<float, N>(row + j));
  if (c.bias != nullptr) {
    const Floats<N> b = core::widen(core::load_cached<B, N>(static_cast<const B*>(c.bias) + j));
#pragma unroll
    for (int i = 0; i < N; ++i) l.v[i] += b.v[i];
  }
  return l;
}

// The pair (m, s) merged with (m2, s2): sums rescaled to the larger max (0 while it is -inf).
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  const float base = top == -INFINITY ? 0.0f : top;
  s = s * expf(m - base) + s2 * expf(m2 - base);
  m = top;
}

template <typename B, int N>
__global__ void __launch_bounds__(32 * kWarps) cross_entropy_stats_kernel(const CrossEntropyStatsParams p) {
  const CrossEntropyChunk& c = p.chunk;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= c.rows) return;  // (the whole warp)
  const int lane = threadIdx.x % 32;
  const float* row = c.logits + r * c.logits_row_stride;
  float m = -INFINITY, s = 0.0f;
#pragma unroll 4
  for (int64_t j = static_cast<int64_t>(lane) * N; j < c.cols; j += 32 * N) {
    const Floats<N> l = logits_at<B, N>(c, row, j);
    float top = l.v[0];
#pragma unroll
    for (int i = 1; i < N; ++i) top = fmaxf(top, l.v[i]);
    if (top > m) {
      s *= expf(m - top);
      m = top;
    }
    const float base = m == -INFINITY ? 0.0f : m;
#pragma unroll
    for (int i = 0; i < N; ++i) s += expf(l.v[i] - base);  // (a NaN logit makes s NaN)
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
  }
  if (lane != 0) return;
  float row_max = p.row_max[r], row_sum = p.row_sum[r];
  merge(row_max, row_sum, m, s);
  if (row_max != -INFINITY) {
    p.row_max[r] = row_max;
    p.row_sum[r] = row_sum;
  }
  const int64_t col = c.target[r] - c.class0;
  if (c.target[r] >= c.class0 && col < c.cols) p.picked[r] = logits_at<B, 1>(c, row, col).v[0];
}

template <typename B, typename G, int N>
__global__ void __launch_bounds__(32 * kWarps) cross_entropy_grad_kernel(const CrossEntropyGradParams p) {
  const CrossEntropyChunk& c = p.chunk;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= c.rows) return;
  const int lane = threadIdx.x % 32;
  const float* row = c.logits + r * c.logits_row_stride;
  G* out = static_cast<G*>(p.grad) + r * p.grad_row_stride;
  const float lse = p.lse[r], a = p.softmax_weight[r], b = p.target_weight[r];
  const int64_t col = c.target[r] < 0 ? -1 : c.target[r] - c.class0;  // (may lie outside the chunk)
#pragma unroll 4
  for (int64_t j = static_cast<int64_t>(lane) * N; j < c.cols; j += 32 * N) {
    const Floats<N> l = logits_at<B, N>(c, row, j);
    Floats<N> g;
#pragma unroll
    for (int i = 0; i < N; ++i) g.v[i] = expf(l.v[i] - lse) * a - (j + i == col ? b : 0.0f);
    core::store(out + j, core::narrow<G, N>(g));
  }
}

dim3 grid_of(int64_t rows) { return dim3(static_cast<unsigned>(host_util::ceil_div(rows, kWarps))); }

template <typename T>
struct Type {
  using type = T;
};

// f(Type<T>{}) with T the C++ type of dtype.
template <typename F>
cudaError_t with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(Type<float>{});
    case DType::kFloat16: return f(Type<__half>{});
    case DType::kBFloat16: return f(Type<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

// What a launcher returns without a kernel: an error for params that validate() rejects or a
// grid too large, success for an empty chunk; nullopt when the kernel runs.
template <typename Params>
std::optional<cudaError_t> before_launch(const Params& p) {
  if (validate(p) != nullptr) return cudaErrorInvalidValue;
  if (p.chunk.rows == 0 || p.chunk.cols == 0) return cudaSuccess;
  if (host_util::ceil_div(p.chunk.rows, kWarps) > INT32_MAX) return cudaErrorInvalidConfiguration;
  return std::nullopt;
}

}  // namespace

cudaError_t launch(const CrossEntropyStatsParams& p, cudaStream_t stream) {
  if (const std::optional<cudaError_t> early = before_launch(p)) return *early;
  const bool vec = cross_entropy_vector(p) == 4;
  return with_type(p.chunk.bias_dtype, [&](auto bias_type) {
    using B = typename decltype(bias_type)::type;
    if (vec) {
      cross_entropy_stats_kernel<B, 4><<<grid_of(p.chunk.rows), 32 * kWarps, 0, stream>>>(p);
    } else {
      cross_entropy_stats_kernel<B, 1><<<grid_of(p.chunk.rows), 32 * kWarps, 0, stream>>>(p);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch(const CrossEntropyGradParams& p, cudaStream_t stream) {
  if (const std::optional<cudaError_t> early = before_launch(p)) return *early;
  const bool vec = cross_entropy_vector(p) == 4;
  return with_type(p.chunk.bias_dtype, [&](auto bias_type) {
    using B = typename decltype(bias_type)::type;
    return with_type(p.grad_dtype, [&](auto grad_type) {
      using G = typename decltype(grad_type)::type;
      if (vec) {
        cross_entropy_grad_kernel<B, G, 4><<<grid_of(p.chunk.rows), 32 * kWarps, 0, stream>>>(p);
      } else {
        cross_entropy_grad_kernel<B, G, 1><<<grid_of(p.chunk.rows), 32 * kWarps, 0, stream>>>(p);
      }
      return cudaGetLastError();
    });
  });
}

}  // namespace ltx_kernels

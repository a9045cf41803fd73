// CUDA kernel of the AdaLN RMS norm backward (include/ltx_kernels/adaln_backward.h): a block of
// 256 threads per row, three passes over the row (its sum of squares, the sum of dxhat * xhat
// with the scale's and weight's terms written, then dx, dy and the gate's terms), the row
// re-read from L1/L2 between them rather than held in registers, so that any width runs. It
// replaces an fp32 ATen composition of ~35 launches per call.
#include "core/reduce.cuh"
#include "core/row_vectors.cuh"
#include "core/vec.cuh"
#include "ltx_kernels/adaln_backward.h"
#include "ops/host_util.h"

namespace ltx_kernels {
namespace {

using core::Floats;

constexpr int kThreads = 256;

template <int N>
__device__ __forceinline__ Floats<N> weight_at(const float* weight, int64_t col) {
  if (weight == nullptr) {
    Floats<N> ones;
#pragma unroll
    for (int j = 0; j < N; ++j) ones.v[j] = 1.0f;
    return ones;
  }
  return core::widen(core::load_cached<float, N>(weight + col));
}

template <typename T, int N, bool GATED>
__global__ void __launch_bounds__(kThreads) adaln_backward_kernel(const AdalnBackwardParams p) {
  __shared__ float scratch[2][core::kMaxWarpsPerBlock];
  const int64_t row = blockIdx.x;
  const int64_t nvec = p.cols / N;
  const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  const T* y = GATED ? static_cast<const T*>(p.y) + row * p.y_row_stride : nullptr;
  const T* gate = GATED ? core::row_vector<T>(p.gate, row, p.tokens) : nullptr;
  const T* scale = core::row_vector<T>(p.scale, row, p.tokens);
  const T* g = static_cast<const T*>(p.grad_out) + row * p.grad_out_row_stride;
  const int64_t out_row = row * p.cols;  // gn, dw, dg: contiguous fp32 rows

  // h = x, or round(x + y * gate) as the forward stored it (multiply and add rounded apart).
  const auto h_at = [&](int64_t col) {
    Floats<N> h = core::widen(core::load_cached<T, N>(x + col));
    if constexpr (GATED) {
      Floats<N> yg = core::widen(core::load_cached<T, N>(y + col));
      if (gate) {
        const Floats<N> gt = core::widen(core::load_cached<T, N>(gate + col));
#pragma unroll
        for (int j = 0; j < N; ++j) yg.v[j] = __fmul_rn(yg.v[j], gt.v[j]);
      }
#pragma unroll
      for (int j = 0; j < N; ++j) h.v[j] = core::round_to<T>(__fadd_rn(h.v[j], yg.v[j]));
    }
    return h;
  };

  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < nvec; i += kThreads) {
    const Floats<N> h = h_at(i * N);
#pragma unroll
    for (int j = 0; j < N; ++j) sum_sq = fmaf(h.v[j], h.v[j], sum_sq);
  }
  sum_sq = core::row_reduce<kThreads>(sum_sq, scratch[0], core::Sum{});
  const float rstd = rsqrtf(sum_sq / static_cast<float>(p.cols) + p.eps);

  // dn = g * (1 + scale); the scale's term g * xhat * w and the weight's dn * xhat.
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < nvec; i += kThreads) {
    const int64_t col = i * N;
    const Floats<N> h = h_at(col), w = weight_at<N>(p.weight, col);
    const Floats<N> gv = core::widen(core::load_cached<T, N>(g + col));
    const Floats<N> s = core::widen(core::load_cached<T, N>(scale + col));
    Floats<N> gn, dw;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float xhat = h.v[j] * rstd, dn = gv.v[j] * (1.0f + s.v[j]);
      dot = fmaf(dn * w.v[j], xhat, dot);
      gn.v[j] = gv.v[j] * xhat * w.v[j];
      dw.v[j] = dn * xhat;
    }
    core::store(p.gn + out_row + col, core::narrow<float>(gn));
    if (p.dw) core::store(p.dw + out_row + col, core::narrow<float>(dw));
  }
  const float mean = core::row_reduce<kThreads>(dot, scratch[1], core::Sum{}) / static_cast<float>(p.cols);

  T* dx = static_cast<T*>(p.dx) + row * p.dx_row_stride;
  T* dy = GATED ? static_cast<T*>(p.dy) + row * p.dy_row_stride : nullptr;
  const T* gh = GATED ? static_cast<const T*>(p.grad_h) + row * p.grad_h_row_stride : nullptr;
  for (int64_t i = threadIdx.x; i < nvec; i += kThreads) {
    const int64_t col = i * N;
    const Floats<N> h = h_at(col), w = weight_at<N>(p.weight, col);
    const Floats<N> gv = core::widen(core::load_cached<T, N>(g + col));
    const Floats<N> s = core::widen(core::load_cached<T, N>(scale + col));
    Floats<N> d;
#pragma unroll
    for (int j = 0; j < N; ++j) d.v[j] = rstd * (gv.v[j] * (1.0f + s.v[j]) * w.v[j] - h.v[j] * rstd * mean);
    if constexpr (GATED) {
      const Floats<N> ghv = core::widen(core::load_cached<T, N>(gh + col));
      const Floats<N> yv = core::widen(core::load_cached<T, N>(y + col));
      Floats<N> dyv, dg;
      const Floats<N> gt = gate ? core::widen(core::load_cached<T, N>(gate + col)) : Floats<N>{};
#pragma unroll
      for (int j = 0; j < N; ++j) {
        d.v[j] += ghv.v[j];
        dyv.v[j] = gate ? d.v[j] * gt.v[j] : d.v[j];
        dg.v[j] = d.v[j] * yv.v[j];
      }
      core::store(dy + col, core::narrow<T>(dyv));
      if (p.dg) core::store(p.dg + out_row + col, core::narrow<float>(dg));
    }
    core::store(dx + col, core::narrow<T>(d));
  }
}

template <typename T, int N>
cudaError_t launch_vec(const AdalnBackwardParams& p, cudaStream_t stream) {
  if (p.rows > INT32_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (p.y != nullptr) {
    adaln_backward_kernel<T, N, true><<<grid, kThreads, 0, stream>>>(p);
  } else {
    adaln_backward_kernel<T, N, false><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const AdalnBackwardParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  return adaln_backward_vector(p) == kVec ? launch_vec<T, kVec>(p, stream) : launch_vec<T, 1>(p, stream);
}

}  // namespace

cudaError_t launch(const AdalnBackwardParams& p, cudaStream_t stream) {
  if (validate(p) != nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32: return launch_typed<float>(p, stream);
    case DType::kFloat16: return launch_typed<__half>(p, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx_kernels

// CUDA kernel and launcher of the fused norm backward (include/ltx_kernels/norm_backward.h).
//
// Persistent blocks of 256 threads walk the rows (block b takes row groups b, b + blocks, ...);
// each row is read once (x, dy, grad_new_residual) into registers, reduced
// (RMS: sum h^2 and sum dxhat * h together; layer norm: the mean, then three sums), and dx
// written. A thread keeps the same columns for every row it visits, so its share of dw and
// dbias accumulates in fp32 registers over all of them; at the end the block's row groups add
// theirs in shared memory in a fixed order and the block writes its partial row, which a
// second kernel sums over the blocks.
#include <climits>

#include "core/convert.cuh"
#include "core/reduce.cuh"
#include "core/vec.cuh"
#include "ops/norm_backward_plan.h"

namespace ltx_kernels {
namespace {

using core::Floats;
using core::Vec;

// One scratch per reduction of a row (up to four): a scratch is written again (next row)
// only after every warp passed the following reduction's barrier, so after it was read.
constexpr int kScratches = 4;

template <typename T, int N, int ITEMS, int TPR, bool LAYER, bool NEW_RESIDUAL>
__global__ void __launch_bounds__(kNormBackwardThreads) norm_backward_kernel(const NormBackwardParams p,
                                                                                  const float inv_cols) {
  constexpr int kGroups = kNormBackwardThreads / TPR;
  __shared__ float scratch[kScratches][core::kMaxWarpsPerBlock];
  const int nvec = static_cast<int>((p.cols + N - 1) / N);
  const auto col = [&](int i) { return (static_cast<int>(threadIdx.x) + i * TPR) * N; };
  const auto valid = [&](int i) { return static_cast<int>(threadIdx.x) + i * TPR < nvec; };

  // w = weight + offset of this thread's columns, for every row; and its dw / dbias shares.
  Floats<N> w[ITEMS], dw[ITEMS], db[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) w[i].v[j] = 1.0f, dw[i].v[j] = 0.0f, db[i].v[j] = 0.0f;
    if (p.weight && valid(i)) {  // once per thread: the dtype's branch costs nothing
      const Floats<N> wv = p.weight_dtype == DType::kFloat32
                               ? core::widen(core::load_cached<float, N>(static_cast<const float*>(p.weight) + col(i)))
                               : core::widen(core::load_cached<T, N>(static_cast<const T*>(p.weight) + col(i)));
#pragma unroll
      for (int j = 0; j < N; ++j) w[i].v[j] = wv.v[j] + p.weight_offset;
    }
  }

  const int64_t row_groups = (p.rows + kGroups - 1) / kGroups;
  for (int64_t group = blockIdx.x; group < row_groups; group += gridDim.x) {
    const int64_t row = group * kGroups + threadIdx.y;
    const bool active = row < p.rows;
    const int64_t r = active ? row : 0;
    const T* x = static_cast<const T*>(p.x) + r * p.x_row_stride;
    const T* dy_row = static_cast<const T*>(p.grad_out) + r * p.grad_out_row_stride;
    Floats<N> h[ITEMS], dxhat[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      Vec<T, N> hv = core::zeros<T, N>(), dv = core::zeros<T, N>();
      if (active && valid(i)) {
        hv = core::load_stream<T, N>(x + col(i));
        dv = core::load_stream<T, N>(dy_row + col(i));
      }
      h[i] = core::widen(hv);
      dxhat[i] = core::widen(dv);  // dy for now
    }
    float rstd, mean_dxhat = 0.0f, mean_dxhat_xc;
    if constexpr (LAYER) {
      // Centred on the row's first element first, as the forward does, so that a row like
      // 1e3 +- 1e-2 keeps its spread in fp32.
      const float pivot = static_cast<float>(x[0]);
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < ITEMS; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) h[i].v[j] = valid(i) ? h[i].v[j] - pivot : 0.0f, sum += h[i].v[j];
      const float mean = core::row_sum<TPR>(sum, scratch[0]) * inv_cols;
      float sq = 0.0f, s_d = 0.0f, s_dx = 0.0f;
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const float xc = valid(i) ? h[i].v[j] - mean : 0.0f;
          const float d = dxhat[i].v[j] * w[i].v[j];
          h[i].v[j] = xc;
          sq = fmaf(xc, xc, sq);
          s_d += d;
          s_dx = fmaf(d, xc, s_dx);
        }
      }
      rstd = rsqrtf(core::row_sum<TPR>(sq, scratch[1]) * inv_cols + p.eps);
      mean_dxhat = core::row_sum<TPR>(s_d, scratch[2]) * inv_cols;
      mean_dxhat_xc = core::row_sum<TPR>(s_dx, scratch[3]) * inv_cols;
    } else {
      float sq = 0.0f, s_dx = 0.0f;
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          sq = fmaf(h[i].v[j], h[i].v[j], sq);
          s_dx = fmaf(dxhat[i].v[j] * w[i].v[j], h[i].v[j], s_dx);
        }
      }
      rstd = rsqrtf(core::row_sum<TPR>(sq, scratch[0]) * inv_cols + p.eps);
      mean_dxhat_xc = core::row_sum<TPR>(s_dx, scratch[1]) * inv_cols;
    }
    if (!active) continue;
    // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), with xhat = h rstd (h centred
    // for layer norm): mean(dxhat xhat) xhat = rstd^2 mean(dxhat h) h.
    const float c = rstd * rstd * mean_dxhat_xc;
    T* out = static_cast<T*>(p.out) + row * p.out_row_stride;
    const T* gnr = NEW_RESIDUAL ? static_cast<const T*>(p.grad_new_residual) + row * p.grad_new_residual_row_stride
                                : nullptr;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (!valid(i)) continue;
      Floats<N> extra{};
      if constexpr (NEW_RESIDUAL) extra = core::widen(core::load_stream<T, N>(gnr + col(i)));
      Floats<N> dx;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float dy = dxhat[i].v[j];
        const float xhat = h[i].v[j] * rstd;
        dw[i].v[j] = fmaf(dy, xhat, dw[i].v[j]);
        if constexpr (LAYER) db[i].v[j] += dy;
        const float d = dy * w[i].v[j] - mean_dxhat;
        dx.v[j] = rstd * fmaf(-c, h[i].v[j], d) + (NEW_RESIDUAL ? extra.v[j] : 0.0f);
      }
      core::store(out + col(i), core::narrow<T>(dx));
    }
  }

  // The block's partial dw (and dbias): its row groups' shares added in shared memory in
  // group order, then one row written.
  if (p.dweight_partial == nullptr && p.dbias_partial == nullptr) return;  // uniform: before any barrier
  __shared__ float acc[2][kGroups > 1 ? TPR * ITEMS * N : 1];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if constexpr (kGroups > 1) {
      if (static_cast<int>(threadIdx.y) == g) {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i)
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const int at = (threadIdx.x + i * TPR) * N + j;
            acc[0][at] = g == 0 ? dw[i].v[j] : acc[0][at] + dw[i].v[j];
            acc[1][at] = g == 0 ? db[i].v[j] : acc[1][at] + db[i].v[j];
          }
      }
      __syncthreads();
    }
  }
  if (threadIdx.y != 0) return;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (!valid(i)) continue;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int c = col(i) + j;
      if (c >= p.cols) break;
      const int at = (threadIdx.x + i * TPR) * N + j;
      const float dwv = kGroups > 1 ? acc[0][at] : dw[i].v[j];
      const float dbv = kGroups > 1 ? acc[1][at] : db[i].v[j];
      if (p.dweight_partial) p.dweight_partial[blockIdx.x * p.cols + c] = dwv;
      if (p.dbias_partial) p.dbias_partial[blockIdx.x * p.cols + c] = dbv;
    }
  }
}

// dweight / dbias: the partial rows summed in block order (fp32), stored in the weight's dtype.
// A block covers 32 columns with 8 slices of the partial rows, whose sums are added in slice
// order: coalesced 128-byte rows, several loads in flight per thread.
constexpr int kSumColumns = 32, kSumSlices = 8;

template <typename W>
__global__ void __launch_bounds__(kSumColumns * kSumSlices)
    sum_partial_rows_kernel(const float* partial, int64_t blocks, int64_t cols, W* out) {
  __shared__ float slices[kSumSlices][kSumColumns];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumColumns + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
#pragma unroll 4
    for (int64_t b = threadIdx.y; b < blocks; b += kSumSlices) sum += partial[b * cols + c];
  }
  slices[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float total = slices[0][threadIdx.x];
#pragma unroll
  for (int s = 1; s < kSumSlices; ++s) total += slices[s][threadIdx.x];
  out[c] = core::from_float<W>(total);
}

template <typename T>
cudaError_t sum_partial_rows(const NormBackwardParams& p, const float* partial, void* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.cols + kSumColumns - 1) / kSumColumns));
  const dim3 block(kSumColumns, kSumSlices);
  if (p.weight_dtype == DType::kFloat32) {
    sum_partial_rows_kernel<float><<<grid, block, 0, stream>>>(partial, p.blocks, p.cols, static_cast<float*>(out));
  } else {
    sum_partial_rows_kernel<T><<<grid, block, 0, stream>>>(partial, p.blocks, p.cols, static_cast<T*>(out));
  }
  return cudaGetLastError();
}

template <typename T, int N, int ITEMS, int TPR>
cudaError_t launch_shape(const NormBackwardParams& p, cudaStream_t stream) {
  const dim3 block(TPR, kNormBackwardThreads / TPR);
  const dim3 grid(static_cast<unsigned>(p.blocks));
  const float inv_cols = 1.0f / static_cast<float>(p.cols);  // on the host: see norm_kernels.cuh
  if (p.type == NormType::kLayer) {
    norm_backward_kernel<T, N, ITEMS, TPR, true, false><<<grid, block, 0, stream>>>(p, inv_cols);
  } else if (p.grad_new_residual) {
    norm_backward_kernel<T, N, ITEMS, TPR, false, true><<<grid, block, 0, stream>>>(p, inv_cols);
  } else {
    norm_backward_kernel<T, N, ITEMS, TPR, false, false><<<grid, block, 0, stream>>>(p, inv_cols);
  }
  return cudaGetLastError();
}

template <typename T, int N>
cudaError_t launch_vec(const NormBackwardParams& p, const NormBackwardPlan& plan, cudaStream_t stream) {
  if (plan.threads_per_row == 32) {
    return plan.items == 1 ? launch_shape<T, N, 1, 32>(p, stream) : launch_shape<T, N, 2, 32>(p, stream);
  }
  switch (plan.items) {
    case 1: return launch_shape<T, N, 1, kNormBackwardThreads>(p, stream);
    case 2: return launch_shape<T, N, 2, kNormBackwardThreads>(p, stream);
    case 4: return launch_shape<T, N, 4, kNormBackwardThreads>(p, stream);
    case 8: return launch_shape<T, N, 8, kNormBackwardThreads>(p, stream);
    default: return cudaErrorInvalidConfiguration;
  }
}

template <typename T>
cudaError_t launch_typed(const NormBackwardParams& p, const NormBackwardPlan& plan, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  cudaError_t error = plan.vec == kVec ? launch_vec<T, kVec>(p, plan, stream) : launch_vec<T, 1>(p, plan, stream);
  if (error == cudaSuccess && p.dweight_partial) error = sum_partial_rows<T>(p, p.dweight_partial, p.dweight, stream);
  if (error == cudaSuccess && p.dbias_partial) error = sum_partial_rows<T>(p, p.dbias_partial, p.dbias, stream);
  return error;
}

}  // namespace

cudaError_t launch(const NormBackwardParams& p, cudaStream_t stream) {
  if (validate(p) != nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  const NormBackwardPlan plan = plan_norm_backward(p);
  if (plan.items == 0 || p.blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  switch (p.dtype) {
    case DType::kFloat32: return launch_typed<float>(p, plan, stream);
    case DType::kFloat16: return launch_typed<__half>(p, plan, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, plan, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx_kernels

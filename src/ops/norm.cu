// CUDA kernels and launcher of the norm family (see include/ltx_kernels/norm.h).
//
// A group of threads_per_row threads owns one row. When the row fits (items > 0) it is read
// once into registers and normalized from there: each input byte is read once and each
// output byte written once. Longer rows are streamed twice (three times for layer norm),
// the re-reads mostly hitting L2. Blocks are small and light on registers so that many of
// them share an SM and one block's loads overlap another's reduction and stores.
#include <algorithm>
#include <atomic>
#include <climits>

#include "core/async_copy.cuh"
#include "core/reduce.cuh"
#include "core/vec.cuh"
#include "ltx_kernels/norm.h"

namespace ltx_kernels {
namespace {

using core::Floats;

using core::Vec;

template <typename T>
struct RowPtrs {
  const T* x;
  const T* residual;
  T* residual_out;
  T* out;
};

template <typename T>
__device__ __forceinline__ RowPtrs<T> row_ptrs(const NormParams& p, int64_t row) {
  RowPtrs<T> r;
  r.x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  r.residual = p.residual ? static_cast<const T*>(p.residual) + row * p.residual_row_stride
                          : nullptr;
  r.residual_out =
      p.residual_out ? static_cast<T*>(p.residual_out) + row * p.residual_out_row_stride
                     : nullptr;
  r.out = static_cast<T*>(p.out) + row * p.out_row_stride;
  return r;
}

// h = x + residual rounded to T: the value stored as the new residual and normalized.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> add_residual(const Vec<T, N>& x, const Vec<T, N>& res) {
  Floats<N> h = core::widen(x);
  const Floats<N> r = core::widen(res);
#pragma unroll
  for (int j = 0; j < N; ++j) h.v[j] += r.v[j];
  return core::narrow<T>(h);
}

// (h - mean) * rstd [* (weight + offset)] [+ bias], rounded to T.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> normalize(const NormParams& p, const Vec<T, N>& hv,
                                               const Vec<T, N>& wv, const Vec<T, N>& bv,
                                               float mean, float rstd) {
  Floats<N> h = core::widen(hv);
#pragma unroll
  for (int j = 0; j < N; ++j) h.v[j] = (h.v[j] - mean) * rstd;
  if (p.weight) {
    const Floats<N> w = core::widen(wv);
#pragma unroll
    for (int j = 0; j < N; ++j) h.v[j] *= w.v[j] + p.weight_offset;
  }
  if (p.bias) {
    const Floats<N> b = core::widen(bv);
#pragma unroll
    for (int j = 0; j < N; ++j) h.v[j] += b.v[j];
  }
  return core::narrow<T>(h);
}

// The op variant is a template parameter so that each kernel holds only the registers its
// variant needs (a residual row, a bias): runtime branches would reserve all of them.
enum class Variant { kRms, kAddRms, kLayer };

// Number of inputs read per row: x, plus the residual for kAddRms.
template <Variant V>
constexpr int kInputs = V == Variant::kAddRms ? 2 : 1;

// Normalizes one row held in registers (h: ITEMS vectors per thread, in storage dtype) and
// stores it. Called by every thread of the block (it synchronizes); `active` says whether
// this thread's row exists. affine(i, h, mean, rstd) normalizes vector i with its weight
// and bias (kept in registers by the caller, or loaded).
template <typename T, int N, int ITEMS, Variant V, typename InRow, typename Col, typename Affine>
__device__ __forceinline__ void finish_row(const NormParams& p, const Vec<T, N> (&h)[ITEMS],
                                           bool active, T* out, InRow in_row, Col col,
                                           Affine affine, float* scratch) {
  const float inv_cols = 1.0f / static_cast<float>(p.cols);
  float mean = 0.0f;
  float sq = 0.0f;
  if constexpr (V == Variant::kLayer) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const Floats<N> f = core::widen(h[i]);
#pragma unroll
      for (int j = 0; j < N; ++j) sum += f.v[j];
    }
    mean = core::row_sum(sum, scratch) * inv_cols;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (!in_row(i)) continue;
      const Floats<N> f = core::widen(h[i]);
#pragma unroll
      for (int j = 0; j < N; ++j) sq += (f.v[j] - mean) * (f.v[j] - mean);
    }
  } else {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const Floats<N> f = core::widen(h[i]);
#pragma unroll
      for (int j = 0; j < N; ++j) sq += f.v[j] * f.v[j];
    }
  }
  const float rstd = rsqrtf(core::row_sum(sq, scratch) * inv_cols + p.eps);
  if (!active) return;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
    if (in_row(i)) core::store(out + col(i), affine(i, h[i], mean, rstd));
}

// Weight and bias vector i of a thread, zeros where absent.
template <typename T, int N, Variant V>
__device__ __forceinline__ Vec<T, N> weight_at(const NormParams& p, int64_t col) {
  return p.weight ? core::load_cached<T, N>(static_cast<const T*>(p.weight) + col) : Vec<T, N>{};
}
template <typename T, int N, Variant V>
__device__ __forceinline__ Vec<T, N> bias_at(const NormParams& p, int64_t col) {
  return V == Variant::kLayer && p.bias ? core::load_cached<T, N>(static_cast<const T*>(p.bias) + col)
                                        : Vec<T, N>{};
}

// Row staged through shared memory: 16-byte vectors, ITEMS per thread. Blocks are
// persistent (block g handles row groups g, g + gridDim.x, ...) and keep kStages - 1 row
// groups in flight with cp.async while the current one is reduced and stored, so each SM
// has enough bytes in flight to saturate HBM. Weight and bias are loaded once per block.
// Shared memory: [kStages][kInputs][ITEMS][block threads] vectors; each thread copies and
// reads back only its own slots.
constexpr int kStages = 4;

template <typename T, int N, int ITEMS, Variant V>
__global__ void __launch_bounds__(kMaxCachedThreads) norm_staged_kernel(const NormParams p) {
  static_assert(sizeof(Vec<T, N>) == 16, "cp.async copies 16-byte vectors");
  extern __shared__ uint4 staged[];
  __shared__ float scratch[core::kMaxWarpsPerBlock];
  constexpr int kIn = kInputs<V>;
  const int64_t nvec = p.cols / N;
  const int64_t groups = (p.rows + blockDim.y - 1) / blockDim.y;
  const int threads = blockDim.x * blockDim.y;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const auto col = [&](int i) { return (threadIdx.x + static_cast<int64_t>(i) * blockDim.x) * N; };
  const auto in_row = [&](int i) { return threadIdx.x + i * blockDim.x < nvec; };
  const auto row_of = [&](int64_t group) { return group * blockDim.y + threadIdx.y; };
  const auto slot = [&](int stage, int input, int i) -> uint4* {
    return staged + ((stage * kIn + input) * ITEMS + i) * threads + tid;
  };
  // Starts copying the inputs of row group `group` into `stage`; always commits a group so
  // that every thread counts the same number of groups.
  const auto issue = [&](int64_t group, int stage) {
    const int64_t row = row_of(group);
    if (group < groups && row < p.rows) {
      const RowPtrs<T> r = row_ptrs<T>(p, row);
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        if (!in_row(i)) continue;
        core::async_copy16(slot(stage, 0, i), r.x + col(i));
        if constexpr (V == Variant::kAddRms) core::async_copy16(slot(stage, 1, i), r.residual + col(i));
      }
    }
    core::async_commit();
  };

  int64_t group = blockIdx.x;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(group + s * gridDim.x, s);

  Vec<T, N> w[ITEMS], b[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    w[i] = in_row(i) ? weight_at<T, N, V>(p, col(i)) : Vec<T, N>{};
    b[i] = in_row(i) ? bias_at<T, N, V>(p, col(i)) : Vec<T, N>{};
  }
  const auto affine = [&](int i, const Vec<T, N>& h, float mean, float rstd) {
    return normalize(p, h, w[i], b[i], mean, rstd);
  };

  for (int it = 0; group < groups; group += gridDim.x, ++it) {
    issue(group + (kStages - 1) * static_cast<int64_t>(gridDim.x), (it + kStages - 1) % kStages);
    core::async_wait<kStages - 1>();  // this iteration's group has landed
    const int stage = it % kStages;
    const int64_t row = row_of(group);
    const bool active = row < p.rows;
    const RowPtrs<T> r = row_ptrs<T>(p, active ? row : 0);
    Vec<T, N> h[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const bool valid = active && in_row(i);
      h[i] = valid ? *reinterpret_cast<const Vec<T, N>*>(slot(stage, 0, i)) : core::zeros<T, N>();
      if constexpr (V == Variant::kAddRms) {
        if (valid) {
          h[i] = add_residual(h[i], *reinterpret_cast<const Vec<T, N>*>(slot(stage, 1, i)));
          core::store(r.residual_out + col(i), h[i]);
        }
      }
    }
    finish_row<T, N, ITEMS, V>(p, h, active, r.out, in_row, col, affine, scratch);
  }
  core::async_wait<0>();
}

// Row held in registers: ITEMS vectors of N elements per thread, kept in the storage dtype;
// for rows that are not 16-byte aligned or too long to stage. Persistent like the above.

template <typename T, int N, int ITEMS, Variant V>
__global__ void __launch_bounds__(kMaxCachedThreads) norm_cached_kernel(const NormParams p) {
  __shared__ float scratch[core::kMaxWarpsPerBlock];
  const int64_t nvec = p.cols / N;
  const int64_t groups = (p.rows + blockDim.y - 1) / blockDim.y;
  // Element offset of this thread's vector i, and whether it lies in the row (recomputed
  // rather than stored: an array of flags spills).
  const auto col = [&](int i) { return (threadIdx.x + static_cast<int64_t>(i) * blockDim.x) * N; };
  const auto in_row = [&](int i) { return threadIdx.x + i * blockDim.x < nvec; };

  // Weight and bias are re-read (from L1/L2) for each row: with the row itself in
  // registers, keeping them there too would spill.
  const auto affine = [&](int i, const Vec<T, N>& h, float mean, float rstd) {
    return normalize(p, h, weight_at<T, N, V>(p, col(i)), bias_at<T, N, V>(p, col(i)), mean, rstd);
  };
  for (int64_t group = blockIdx.x; group < groups; group += gridDim.x) {
    const int64_t row = group * blockDim.y + threadIdx.y;
    const bool active = row < p.rows;
    const RowPtrs<T> r = row_ptrs<T>(p, active ? row : 0);
    Vec<T, N> h[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
      h[i] = active && in_row(i) ? core::load_stream<T, N>(r.x + col(i)) : core::zeros<T, N>();
    if constexpr (V == Variant::kAddRms) {
      Vec<T, N> res[ITEMS];
#pragma unroll
      for (int i = 0; i < ITEMS; ++i)
        if (active && in_row(i)) res[i] = core::load_stream<T, N>(r.residual + col(i));
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        if (!(active && in_row(i))) continue;
        // Normalize exactly the value that is stored as the new residual.
        h[i] = add_residual(h[i], res[i]);
        core::store(r.residual_out + col(i), h[i]);
      }
    }
    finish_row<T, N, ITEMS, V>(p, h, active, r.out, in_row, col, affine, scratch);
  }
}

// Row too long for registers: stream it, re-reading for each pass.
template <typename T, int N>
__global__ void __launch_bounds__(kMaxStreamedThreads) norm_streamed_kernel(const NormParams p) {
  __shared__ float scratch[core::kMaxWarpsPerBlock];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool active = row < p.rows;
  const int64_t nvec = active ? p.cols / N : 0;
  const RowPtrs<T> r = row_ptrs<T>(p, active ? row : 0);
  // After the first pass the (rounded) input lives here; re-reads see this thread's stores.
  const T* h_src = r.residual ? r.residual_out : r.x;
  const T* weight = static_cast<const T*>(p.weight);
  const T* bias = static_cast<const T*>(p.bias);

  float sum = 0.0f;
  float sq = 0.0f;
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    Vec<T, N> hv = core::load_stream<T, N>(r.x + v * N);
    if (r.residual) {
      hv = add_residual(hv, core::load_stream<T, N>(r.residual + v * N));
      core::store(r.residual_out + v * N, hv);
    }
    const Floats<N> h = core::widen(hv);
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
      const Floats<N> h = core::widen(core::load_stream<T, N>(h_src + v * N));
#pragma unroll
      for (int j = 0; j < N; ++j) sq += (h.v[j] - mean) * (h.v[j] - mean);
    }
  }
  const float rstd = rsqrtf(core::row_sum(sq, scratch) * inv_cols + p.eps);
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    const Vec<T, N> w = weight ? core::load_cached<T, N>(weight + v * N) : Vec<T, N>{};
    const Vec<T, N> b = bias ? core::load_cached<T, N>(bias + v * N) : Vec<T, N>{};
    const Vec<T, N> h = core::load_stream<T, N>(h_src + v * N);
    core::store(r.out + v * N, normalize(p, h, w, b, mean, rstd));
  }
}

// Launches a persistent kernel: as many blocks as fit on the device at once, fewer when
// there are fewer row groups. blocks_per_sm_cache is the kernel's own (occupancy_cache).
template <typename Kernel>
cudaError_t launch_persistent(Kernel kernel, std::atomic<int>* blocks_per_sm_cache,
                              const NormParams& p, const NormLaunchPlan& plan, size_t smem,
                              cudaStream_t stream) {
  const dim3 block(plan.threads_per_row, plan.rows_per_block);
  const int threads = block.x * block.y;
  // Occupancy depends only on the kernel and the block size (which fixes the shared memory).
  std::atomic<int>& cached = blocks_per_sm_cache[threads / 32];
  int blocks_per_sm = cached.load(std::memory_order_relaxed);
  if (blocks_per_sm == 0) {
    cudaError_t error = cudaSuccess;
    if (smem > 48 * 1024)
      error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(smem));
    if (error == cudaSuccess)
      error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, smem);
    if (error != cudaSuccess) return error;
    if (blocks_per_sm == 0) return cudaErrorInvalidConfiguration;  // does not fit on an SM
    cached.store(blocks_per_sm, std::memory_order_relaxed);
  }
  int device = 0, sms = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess)
    error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error != cudaSuccess) return error;
  const int64_t blocks = std::min<int64_t>(plan.blocks, int64_t{sms} * blocks_per_sm);
  kernel<<<static_cast<unsigned>(blocks), block, smem, stream>>>(p);
  return cudaGetLastError();
}

// One occupancy cache per kernel instantiation, indexed by block threads / 32.
template <typename T, int N, int ITEMS, Variant V, bool STAGED>
std::atomic<int>* occupancy_cache() {
  static std::atomic<int> cache[kMaxCachedThreads / 32 + 1];
  return cache;
}

template <typename T, int N, int ITEMS, Variant V>
cudaError_t launch_variant(const NormParams& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  if constexpr (sizeof(Vec<T, N>) == 16 && ITEMS <= 2) {
    const size_t smem = size_t{kStages} * kInputs<V> * ITEMS * plan.threads_per_row *
                        plan.rows_per_block * sizeof(uint4);
    return launch_persistent(norm_staged_kernel<T, N, ITEMS, V>,
                             occupancy_cache<T, N, ITEMS, V, true>(), p, plan, smem, stream);
  } else {
    return launch_persistent(norm_cached_kernel<T, N, ITEMS, V>,
                             occupancy_cache<T, N, ITEMS, V, false>(), p, plan, 0, stream);
  }
}

template <typename T, int N, int ITEMS>
cudaError_t launch_cached(const NormParams& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  if (p.type == NormType::kLayer) return launch_variant<T, N, ITEMS, Variant::kLayer>(p, plan, stream);
  if (p.residual) return launch_variant<T, N, ITEMS, Variant::kAddRms>(p, plan, stream);
  return launch_variant<T, N, ITEMS, Variant::kRms>(p, plan, stream);
}

template <typename T, int N>
cudaError_t launch_vec(const NormParams& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  switch (plan.items) {
    case 0: {
      if (plan.blocks > INT_MAX) return cudaErrorInvalidConfiguration;
      const dim3 block(plan.threads_per_row, plan.rows_per_block);
      norm_streamed_kernel<T, N><<<static_cast<unsigned>(plan.blocks), block, 0, stream>>>(p);
      return cudaGetLastError();
    }
    case 1: return launch_cached<T, N, 1>(p, plan, stream);
    case 2: return launch_cached<T, N, 2>(p, plan, stream);
    case 4: return launch_cached<T, N, 4>(p, plan, stream);
    case 8: return launch_cached<T, N, 8>(p, plan, stream);
    default: return cudaErrorInvalidConfiguration;
  }
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
  switch (p.dtype) {
    case DType::kFloat32: return launch_typed<float>(p, plan, stream);
    case DType::kFloat16: return launch_typed<__half>(p, plan, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, plan, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx_kernels

// CUDA kernels of the norm family (see include/ltx_kernels/norm.h) and their launch by plan,
// included by one file per input dtype (norm_<dtype>.cu), which compile in parallel.
//
// A group of threads_per_row threads owns one row. When the row fits (items > 0) it is read
// once into registers and normalized from there: each input byte is read once and each
// output byte written once. Longer rows are streamed twice (three times for layer norm),
// the re-reads mostly hitting L2. Blocks are small and light on registers so that many of
// them share an SM and one block's loads overlap another's reduction and stores.
// Occupancy was what mattered on H100 (ncu, D = 2048): persistent blocks that prefetched
// rows through shared memory with cp.async ran slower than this at 27-32 registers.
#pragma once

#include <climits>
#include <type_traits>

#include "core/fp8.cuh"
#include "core/reduce.cuh"
#include "core/row_vectors.cuh"
#include "core/vec.cuh"
#include "ops/norm_launch.h"

namespace ltx_kernels::norm_cuda {

using core::Floats;

using core::Vec;

// T: the dtype of x and the residuals; O: of out (T, or float: NormParams::out_dtype).
template <typename T, typename O>
struct RowPtrs {
  const T* x;
  const T* residual;
  T* new_residual;
  O* out;
};

template <typename T, typename O>
__device__ __forceinline__ RowPtrs<T, O> row_ptrs(const NormParams& p, int64_t row) {
  RowPtrs<T, O> r;
  r.x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  r.residual = p.residual ? static_cast<const T*>(p.residual) + row * p.residual_row_stride
                          : nullptr;
  r.new_residual =
      p.new_residual ? static_cast<T*>(p.new_residual) + row * p.new_residual_row_stride
                     : nullptr;
  r.out = static_cast<O*>(p.out) + row * p.out_row_stride;  // null (stride 0) when only FP8 goes out
  return r;
}

// h = residual + x [* gate] rounded to T: the value stored as the new residual and
// normalized. Multiply and add are rounded separately (no FMA), as in the CPU reference.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> add_residual(const Vec<T, N>& x, const Vec<T, N>& res,
                                                  const Vec<T, N>* gate) {
  Floats<N> h = core::widen(x);
  const Floats<N> r = core::widen(res);
  if (gate) {
    const Floats<N> g = core::widen(*gate);
#pragma unroll
    for (int j = 0; j < N; ++j) h.v[j] = __fmul_rn(h.v[j], g.v[j]);
  }
#pragma unroll
  for (int j = 0; j < N; ++j) h.v[j] = __fadd_rn(h.v[j], r.v[j]);
  return core::narrow<T>(h);
}

// ((h - pivot) - mean) * rstd [* (weight + offset)] [+ bias] [* (1 + scale) + shift], rounded
// to O (weight and bias in W). layer_norm's statistics are those of the row shifted by its first element, the pivot
// (see layer_stats); the RMS norms pass 0 for both.
// HAS_BIAS / MOD: whether a bias (layer norm only) or the modulation (sc, sh) can be
// present; as template parameters they keep the other kernels free of their branches.
template <bool HAS_BIAS, bool MOD, typename O, typename T, typename W, int N>
__device__ __forceinline__ Vec<O, N> normalize(const NormParams& p, const Vec<T, N>& hv,
                                               const Vec<W, N>& wv, const Vec<W, N>& bv,
                                               const Vec<T, N>& sc, const Vec<T, N>& sh,
                                               float pivot, float mean, float rstd) {
  Floats<N> h = core::widen(hv);
#pragma unroll
  for (int j = 0; j < N; ++j) h.v[j] = ((h.v[j] - pivot) - mean) * rstd;
  if (p.weight) {
    const Floats<N> w = core::widen(wv);
#pragma unroll
    for (int j = 0; j < N; ++j) h.v[j] *= w.v[j] + p.weight_offset;
  }
  if (HAS_BIAS && p.bias) {
    const Floats<N> b = core::widen(bv);
#pragma unroll
    for (int j = 0; j < N; ++j) h.v[j] += b.v[j];
  }
  if (MOD && p.scale.ptr) {
    const Floats<N> scale = core::widen(sc);
    const Floats<N> shift = core::widen(sh);
#pragma unroll
    for (int j = 0; j < N; ++j) h.v[j] = h.v[j] * (1.0f + scale.v[j]) + shift.v[j];
  }
  return core::narrow<O>(h);
}

// Register budget of the cached kernel, as blocks of 256 threads that must fit on an SM
// (65536 registers): 8 blocks = 32 registers. The plain RMS norm with one vector per thread
// fits in 32, so a full SM of blocks is resident and their loads overlap each other's
// reductions; variants with a residual or bias row need a little more. Measured on H100,
// occupancy mattered more than prefetching rows through shared memory.
// MOD: AdaLN modulation (scale and shift rows), whose vectors take registers too.
template <int ITEMS, NormType TYPE, bool RESIDUAL, bool MOD>
constexpr int kMinBlocksPerSm =
    ITEMS == 1   ? (MOD ? 5 : RESIDUAL ? 6 : 8)
    : ITEMS == 2 ? (MOD ? 3 : TYPE == NormType::kRms && !RESIDUAL ? 5 : 4)
    : ITEMS == 4 ? (MOD || TYPE == NormType::kLayer ? 2 : 3)
                 : (RESIDUAL ? 1 : 2);

// Weight, bias, scale and shift fetched before the reduction so their latency overlaps
// it, when the registers allow: up to 4 vectors' worth per thread (2 with modulation, which
// doubles them; 1 with the FP8 output, whose row max and quantization hold registers too; an
// fp32 weight beside 16-bit x counts twice). Layer norm only at 2 vectors from 32 threads a row,
// in one dtype, without modulation (with it: not measured): H200 bf16, 8 x 4096 (2 x 256)
// 5.4 -> 4.6 us, 1 x 2048 (2 x 128) 4.9 -> 4.4 us, large rows unchanged; its 4 x 64 plan at
// 16128 x 2048 took 43.7 -> 58.6 us with them fetched early and its 1 x 256 plan spills
// (benchmarks/results/h200/norm_plans.md).
template <int ITEMS, NormType TYPE, bool MOD, bool FP8, int WIDEN, int TPR>
constexpr bool kPrefetchAffine =
    ITEMS * WIDEN <= (FP8 ? 1 : MOD ? 2 : 4) &&
    (TYPE != NormType::kLayer || (!MOD && ITEMS == 2 && WIDEN == 1 && TPR >= 32));

// Row held in registers: ITEMS vectors of N elements per thread, in the storage dtype; one
// row per TPR threads, kMaxCachedThreads / TPR rows per block. The block shape is a
// template parameter so index math and reductions compile to constants (a third fewer
// instructions than with blockDim, which shows at memory speed).
// TYPE and RESIDUAL (a residual added, RMS norm only: validate()) are template parameters too,
// so that each kernel holds only the registers it needs (a residual row, a bias): runtime
// branches would reserve all of them. FP8: the row also (or only) goes out quantized; a
// template parameter, so the kernels without it keep their registers. W and O: the dtypes of
// weight / bias and of out (T, or float: NormParams' weight_dtype and out_dtype).
template <typename T, typename W, typename O, int N, int ITEMS, NormType TYPE, bool RESIDUAL, int TPR, bool MOD,
          bool FP8>
__global__ void __launch_bounds__(kMaxCachedThreads, (kMinBlocksPerSm<ITEMS, TYPE, RESIDUAL, MOD>))
    norm_cached_kernel(const NormParams p, const float inv_cols) {
  constexpr int kRowsPerBlock = kMaxCachedThreads / TPR;
  constexpr bool kPrefetch = kPrefetchAffine<ITEMS, TYPE, MOD, FP8, sizeof(W) / sizeof(T), TPR>;
  // One scratch per reduction (mean, squares, FP8 row max), so no barrier is needed before
  // reusing it.
  __shared__ float scratch[3][core::kMaxWarpsPerBlock];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  const bool active = row < p.rows;
  const RowPtrs<T, O> r = row_ptrs<T, O>(p, active ? row : 0);
  const int nvec = static_cast<int>(p.cols / N);
  // Element offset of this thread's vector i, and whether it lies in the row (recomputed
  // rather than stored: an array of flags spills).
  const auto col = [&](int i) { return (threadIdx.x + i * TPR) * N; };
  const auto valid = [&](int i) { return active && threadIdx.x + i * TPR < nvec; };

  Vec<T, N> h[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i)
    h[i] = valid(i) ? core::load_stream<T, N>(r.x + col(i)) : core::zeros<T, N>();
  if constexpr (RESIDUAL) {
    Vec<T, N> res[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
      if (valid(i)) res[i] = core::load_stream<T, N>(r.residual + col(i));
    const T* gate = core::row_vector<T>(p.gate, row, p.tokens);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (!valid(i)) continue;
      // Normalize exactly the value that is stored as the new residual.
      if (gate) {
        const Vec<T, N> g = core::load_cached<T, N>(gate + col(i));
        h[i] = add_residual(h[i], res[i], &g);
      } else {
        h[i] = add_residual<T, N>(h[i], res[i], nullptr);
      }
      core::store(r.new_residual + col(i), h[i]);
    }
  }
  const auto weight_at = [&](int i) {
    return p.weight ? core::load_cached<W, N>(static_cast<const W*>(p.weight) + col(i)) : Vec<W, N>{};
  };
  const auto bias_at = [&](int i) {
    return TYPE == NormType::kLayer && p.bias
               ? core::load_cached<W, N>(static_cast<const W*>(p.bias) + col(i))
               : Vec<W, N>{};
  };
  const T* scale = MOD ? core::row_vector<T>(p.scale, row, p.tokens) : nullptr;
  const T* shift = MOD ? core::row_vector<T>(p.shift, row, p.tokens) : nullptr;
  const auto scale_at = [&](int i) {
    return MOD ? core::load_cached<T, N>(scale + col(i)) : Vec<T, N>{};
  };
  const auto shift_at = [&](int i) {
    return MOD ? core::load_cached<T, N>(shift + col(i)) : Vec<T, N>{};
  };
  Vec<W, N> w[ITEMS], b[ITEMS];
  Vec<T, N> sc[ITEMS], sh[ITEMS];
  if constexpr (kPrefetch) {
    // Selects, not a branch around the loads, so that ptxas issues them beside the row's.
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      w[i] = valid(i) ? weight_at(i) : Vec<W, N>{};
      b[i] = valid(i) ? bias_at(i) : Vec<W, N>{};
      sc[i] = valid(i) ? scale_at(i) : Vec<T, N>{};
      sh[i] = valid(i) ? shift_at(i) : Vec<T, N>{};
    }
  }

  // layer_norm: mean and variance of the row shifted by its first element, the pivot. For a
  // row like 1e3 +- 1e-2 the shifted values are exact and small, so their fp32 sums are too;
  // summing the row itself leaves its mean off by ~1e-4, a percent of the spread. Two-pass
  // variance (squared deviations, not E[x^2] - mean^2, which cancels).
  float pivot = 0.0f, mean = 0.0f, sq = 0.0f;
  if constexpr (TYPE == NormType::kLayer) {
    pivot = static_cast<float>(r.x[0]);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (!valid(i)) continue;
      const Floats<N> f = core::widen(h[i]);
#pragma unroll
      for (int j = 0; j < N; ++j) sum += f.v[j] - pivot;
    }
    mean = core::row_sum<TPR>(sum, scratch[0]) * inv_cols;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (!valid(i)) continue;
      const Floats<N> f = core::widen(h[i]);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float d = (f.v[j] - pivot) - mean;
        sq += d * d;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const Floats<N> f = core::widen(h[i]);
#pragma unroll
      for (int j = 0; j < N; ++j) sq += f.v[j] * f.v[j];
    }
  }
  const float rstd = rsqrtf(core::row_sum<TPR>(sq, scratch[1]) * inv_cols + p.eps);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (!valid(i)) continue;
    if constexpr (!kPrefetch) {
      w[i] = weight_at(i);
      b[i] = bias_at(i);
      sc[i] = scale_at(i);
      sh[i] = shift_at(i);
    }
    if constexpr (std::is_same_v<O, T>) {  // in place (the FP8 pass below reads h again)
      h[i] = normalize<TYPE == NormType::kLayer, MOD, O>(p, h[i], w[i], b[i], sc[i], sh[i], pivot, mean, rstd);
      if (!FP8 || p.out) core::store(r.out + col(i), h[i]);
      if (FP8) core::absmax_into(amax, core::widen(h[i]));
    } else {  // a float32 out: no FP8 output (validate)
      core::store(r.out + col(i),
                  normalize<TYPE == NormType::kLayer, MOD, O>(p, h[i], w[i], b[i], sc[i], sh[i], pivot, mean, rstd));
    }
  }
  if constexpr (!FP8) return;
  // The row, as rounded to T above, quantized with its max.
  const core::Fp8Row fp8 = core::fp8_row(core::row_reduce<TPR>(amax, scratch[2], core::NanMax{}));
  if (!active) return;
  uint8_t* q = p.out_fp8 + row * p.out_fp8_row_stride;
  if (threadIdx.x == 0) p.out_fp8_scale[row] = fp8.scale;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (valid(i)) core::store(q + col(i), core::to_e4m3(core::widen(h[i]), fp8.inv));
  }
}

// Row too long for registers: stream it, re-reading for each pass.
template <typename T, typename W, typename O, int N>
__global__ void __launch_bounds__(kMaxStreamedThreads) norm_streamed_kernel(const NormParams p,
                                                                            const float inv_cols) {
  __shared__ float scratch[3][core::kMaxWarpsPerBlock];
  const int64_t row = blockIdx.x;  // one row per block of kMaxStreamedThreads
  const bool active = row < p.rows;
  const int64_t nvec = active ? p.cols / N : 0;
  const RowPtrs<T, O> r = row_ptrs<T, O>(p, active ? row : 0);
  // After the first pass the (rounded) input lives here; re-reads see this thread's stores.
  const T* h_src = r.residual ? r.new_residual : r.x;
  const W* weight = static_cast<const W*>(p.weight);
  const W* bias = static_cast<const W*>(p.bias);
  const T* gate = core::row_vector<T>(p.gate, active ? row : 0, p.tokens);
  const T* scale = core::row_vector<T>(p.scale, active ? row : 0, p.tokens);
  const T* shift = core::row_vector<T>(p.shift, active ? row : 0, p.tokens);

  // layer_norm's pivot, as in norm_cached_kernel (its rows have no residual: h_src is x).
  const float pivot = p.type == NormType::kLayer ? static_cast<float>(r.x[0]) : 0.0f;
  float sum = 0.0f;
  float sq = 0.0f;
  for (int64_t v = threadIdx.x; v < nvec; v += kMaxStreamedThreads) {
    Vec<T, N> hv = core::load_stream<T, N>(r.x + v * N);
    if (r.residual) {
      const Vec<T, N> res = core::load_stream<T, N>(r.residual + v * N);
      if (gate) {
        const Vec<T, N> g = core::load_cached<T, N>(gate + v * N);
        hv = add_residual(hv, res, &g);
      } else {
        hv = add_residual<T, N>(hv, res, nullptr);
      }
      core::store(r.new_residual + v * N, hv);
    }
    const Floats<N> h = core::widen(hv);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      sum += h.v[j] - pivot;
      sq += h.v[j] * h.v[j];
    }
  }
  float mean = 0.0f;
  if (p.type == NormType::kLayer) {
    // Two-pass variance: sum of squared deviations, not E[x^2] - mean^2, which cancels.
    mean = core::row_sum<kMaxStreamedThreads>(sum, scratch[0]) * inv_cols;
    sq = 0.0f;
    for (int64_t v = threadIdx.x; v < nvec; v += kMaxStreamedThreads) {
      const Floats<N> h = core::widen(core::load_stream<T, N>(h_src + v * N));
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float d = (h.v[j] - pivot) - mean;
        sq += d * d;
      }
    }
  }
  const float rstd = rsqrtf(core::row_sum<kMaxStreamedThreads>(sq, scratch[1]) * inv_cols + p.eps);
  const auto normalized = [&](int64_t v) {
    const Vec<W, N> w = weight ? core::load_cached<W, N>(weight + v * N) : Vec<W, N>{};
    const Vec<W, N> b = bias ? core::load_cached<W, N>(bias + v * N) : Vec<W, N>{};
    const Vec<T, N> sc = scale ? core::load_cached<T, N>(scale + v * N) : Vec<T, N>{};
    const Vec<T, N> sh = shift ? core::load_cached<T, N>(shift + v * N) : Vec<T, N>{};
    const Vec<T, N> h = core::load_stream<T, N>(h_src + v * N);
    return normalize<true, true, O>(p, h, w, b, sc, sh, pivot, mean, rstd);
  };
  float amax = 0.0f;
  for (int64_t v = threadIdx.x; v < nvec; v += kMaxStreamedThreads) {
    const Vec<O, N> y = normalized(v);
    if (p.out) core::store(r.out + v * N, y);
    if (p.out_fp8) core::absmax_into(amax, core::widen(y));
  }
  // FP8 output: the row max, then the row again, normalized anew (it is not kept).
  if (p.out_fp8 == nullptr) return;
  const core::Fp8Row fp8 =
      core::fp8_row(core::row_reduce<kMaxStreamedThreads>(amax, scratch[2], core::NanMax{}));
  if (!active) return;
  uint8_t* q = p.out_fp8 + row * p.out_fp8_row_stride;
  if (threadIdx.x == 0) p.out_fp8_scale[row] = fp8.scale;
  for (int64_t v = threadIdx.x; v < nvec; v += kMaxStreamedThreads) {
    core::store(q + v * N, core::to_e4m3(core::widen(normalized(v)), fp8.inv));
  }
}

template <typename T, typename W, typename O, int N, int ITEMS, int TPR, bool MOD, bool FP8>
cudaError_t launch_cached(const NormParams& p, const dim3 grid, cudaStream_t stream) {
  const dim3 block(TPR, kMaxCachedThreads / TPR);
  // The kernels' 1 / cols, computed here: an IEEE division in the kernel is a call with a slow
  // path whose registers made the 32-register plain RMS kernel spill.
  const float inv_cols = 1.0f / static_cast<float>(p.cols);
  if (p.type == NormType::kLayer) {
    norm_cached_kernel<T, W, O, N, ITEMS, NormType::kLayer, false, TPR, MOD, FP8><<<grid, block, 0, stream>>>(p, inv_cols);
  } else if (p.residual) {
    norm_cached_kernel<T, W, O, N, ITEMS, NormType::kRms, true, TPR, MOD, FP8><<<grid, block, 0, stream>>>(p, inv_cols);
  } else {
    norm_cached_kernel<T, W, O, N, ITEMS, NormType::kRms, false, TPR, MOD, FP8><<<grid, block, 0, stream>>>(p, inv_cols);
  }
  return cudaGetLastError();
}

// Modulation and the FP8 output come only in one dtype (validate): the mixed-precision
// kernels are compiled without them.
template <typename T, typename W, typename O, int N, int ITEMS, int TPR>
cudaError_t launch_cached(const NormParams& p, const dim3 grid, cudaStream_t stream) {
  if constexpr (std::is_same_v<W, T> && std::is_same_v<O, T>) {
    if (p.scale.ptr) {
      return p.out_fp8 ? launch_cached<T, W, O, N, ITEMS, TPR, true, true>(p, grid, stream)
                       : launch_cached<T, W, O, N, ITEMS, TPR, true, false>(p, grid, stream);
    }
    return p.out_fp8 ? launch_cached<T, W, O, N, ITEMS, TPR, false, true>(p, grid, stream)
                     : launch_cached<T, W, O, N, ITEMS, TPR, false, false>(p, grid, stream);
  } else {
    return launch_cached<T, W, O, N, ITEMS, TPR, false, false>(p, grid, stream);
  }
}

template <typename T, typename W, typename O, int N, int ITEMS>
cudaError_t launch_cached(const NormParams& p, const NormLaunchPlan& plan, const dim3 grid,
                          cudaStream_t stream) {
  // Rows of at most 16 vectors share a warp (plan_norm): compiled for those alone.
  constexpr bool kShortRows = N > 1 && ITEMS == 1;
  switch (plan.threads_per_row) {
    case 8:
      if constexpr (kShortRows) return launch_cached<T, W, O, N, ITEMS, 8>(p, grid, stream);
      return cudaErrorInvalidConfiguration;
    case 16:
      if constexpr (kShortRows) return launch_cached<T, W, O, N, ITEMS, 16>(p, grid, stream);
      return cudaErrorInvalidConfiguration;
    case 32: return launch_cached<T, W, O, N, ITEMS, 32>(p, grid, stream);
    case 64: return launch_cached<T, W, O, N, ITEMS, 64>(p, grid, stream);
    case 128: return launch_cached<T, W, O, N, ITEMS, 128>(p, grid, stream);
    case 256: return launch_cached<T, W, O, N, ITEMS, 256>(p, grid, stream);
    default: return cudaErrorInvalidConfiguration;
  }
}

template <typename T, typename W, typename O, int N>
cudaError_t launch_vec(const NormParams& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  if (plan.blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(plan.blocks));
  switch (plan.items) {
    case 0:
      norm_streamed_kernel<T, W, O, N><<<grid, kMaxStreamedThreads, 0, stream>>>(p, 1.0f / static_cast<float>(p.cols));
      return cudaGetLastError();
    case 1: return launch_cached<T, W, O, N, 1>(p, plan, grid, stream);
    case 2: return launch_cached<T, W, O, N, 2>(p, plan, grid, stream);
    case 4: return launch_cached<T, W, O, N, 4>(p, plan, grid, stream);
    case 8: return launch_cached<T, W, O, N, 8>(p, plan, grid, stream);
    default: return cudaErrorInvalidConfiguration;
  }
}

template <typename T, typename W, typename O>
cudaError_t launch_typed(const NormParams& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  return plan.vec == kVec ? launch_vec<T, W, O, kVec>(p, plan, stream)
                          : launch_vec<T, W, O, 1>(p, plan, stream);
}

}  // namespace ltx_kernels::norm_cuda

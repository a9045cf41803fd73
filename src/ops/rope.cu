// CUDA kernels and launchers of the RoPE family (see include/ltx_kernels/rope.h).
//
// Table rotation: one block per token, its threads sharing the token's cos/sin row across
// every head of q and k (the table is read once from memory, then from L1).
// LTX rotation: persistent blocks, each computing the frequency table once into shared
// memory and then walking tokens; one token's q and k rows are rotated together so each
// angle is computed once for both.
#include <climits>

#include "core/reduce.cuh"
#include "core/vec.cuh"
#include "ltx_kernels/rope.h"
#include "ops/host_util.h"

namespace ltx_kernels {
namespace {

using core::Floats;
using host_util::aligned16;
using core::Vec;

constexpr int kTableThreads = 128;
constexpr int kLtxThreads = 128;

// How a head's channels split into units of work (all counts in units per head).
struct TableLayout {
  int units_per_head = 0;        // rotation units, then pass-through units
  int rot_units = 0;
  int section_units[3] = {0, 0, 0};  // half-split: rotation units of each section
};

template <typename TT, int N>
constexpr int kTableAccess = N < 16 / int(sizeof(TT)) ? N : 16 / int(sizeof(TT));

// out = x * cos + rotate(x) * sin for one unit. Half-split: `lo` and `hi` vectors of N
// channels, `half` channels apart. Interleaved: one vector of W channels holding W / 2
// pairs.
template <typename T, typename TT, int N, bool INTERLEAVED>
__global__ void __launch_bounds__(kTableThreads)
    rope_table_kernel(const RopeParams p, const TableLayout layout) {
  constexpr int W = INTERLEAVED && N < 2 ? 2 : N;  // elements per vector
  constexpr int TA = kTableAccess<TT, N>;
  const int64_t pos = blockIdx.x;
  const int64_t b = pos / p.tokens;
  const int64_t s = pos - b * p.tokens;
  const TT* cos_row = static_cast<const TT*>(p.cos) + b * p.table_batch_stride + s * p.table_token_stride;
  const TT* sin_row = static_cast<const TT*>(p.sin) + b * p.table_batch_stride + s * p.table_token_stride;
  const int64_t rot = rotary_dims(p);
  const int q_units = static_cast<int>(p.q.heads) * layout.units_per_head;
  const int total = q_units + (p.k.in ? static_cast<int>(p.k.heads) * layout.units_per_head : 0);
  for (int idx = threadIdx.x; idx < total; idx += kTableThreads) {
    const bool is_q = idx < q_units;
    const RopeTensor& t = is_q ? p.q : p.k;
    const int local = is_q ? idx : idx - q_units;
    const int head = local / layout.units_per_head;
    const int u = local - head * layout.units_per_head;
    const T* in = static_cast<const T*>(t.in) + b * t.in_strides[0] + s * t.in_strides[1] +
                  head * t.in_strides[2];
    T* out = static_cast<T*>(t.out) + b * t.out_strides[0] + s * t.out_strides[1] +
             head * t.out_strides[2];
    if (u >= layout.rot_units) {  // pass-through channels
      const int64_t c = rot + static_cast<int64_t>(u - layout.rot_units) * N;
      core::store(out + c, core::load_stream<T, N>(in + c));
      continue;
    }
    if constexpr (INTERLEAVED) {
      const int64_t c = static_cast<int64_t>(u) * W;
      const Floats<W> x = core::widen(core::load_stream_parts<T, W, N>(in + c));
      const Floats<W> cs = core::widen(core::load_cached_parts<TT, W, TA>(cos_row + c));
      const Floats<W> sn = core::widen(core::load_cached_parts<TT, W, TA>(sin_row + c));
      Floats<W> y;
#pragma unroll
      for (int j = 0; j < W; j += 2) {
        y.v[j] = x.v[j] * cs.v[j] - x.v[j + 1] * sn.v[j];
        y.v[j + 1] = x.v[j + 1] * cs.v[j + 1] + x.v[j] * sn.v[j + 1];
      }
      core::store_parts<T, W, N>(out + c, core::narrow<T>(y));
    } else {
      int sec = 0;
      int64_t start = 0;
      int v = u;
      while (sec < 2 && v >= layout.section_units[sec]) {
        v -= layout.section_units[sec];
        start += p.sections[sec];
        ++sec;
      }
      const int64_t lo = start + static_cast<int64_t>(v) * N;
      const int64_t hi = lo + p.sections[sec] / 2;
      const Floats<N> xl = core::widen(core::load_stream<T, N>(in + lo));
      const Floats<N> xh = core::widen(core::load_stream<T, N>(in + hi));
      const Floats<N> cl = core::widen(core::load_cached_parts<TT, N, TA>(cos_row + lo));
      const Floats<N> sl = core::widen(core::load_cached_parts<TT, N, TA>(sin_row + lo));
      const Floats<N> ch = core::widen(core::load_cached_parts<TT, N, TA>(cos_row + hi));
      const Floats<N> sh = core::widen(core::load_cached_parts<TT, N, TA>(sin_row + hi));
      Floats<N> yl, yh;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        yl.v[j] = xl.v[j] * cl.v[j] - xh.v[j] * sl.v[j];
        yh.v[j] = xh.v[j] * ch.v[j] + xl.v[j] * sh.v[j];
      }
      core::store(out + lo, core::narrow<T>(yl));
      core::store(out + hi, core::narrow<T>(yh));
    }
  }
}

template <typename T, typename TT, int N>
cudaError_t launch_table(const RopeParams& p, cudaStream_t stream) {
  constexpr int W_INTERLEAVED = N < 2 ? 2 : N;
  TableLayout layout;
  const int64_t rot = rotary_dims(p);
  int64_t rot_units = 0;
  if (p.interleaved) {
    rot_units = rot / W_INTERLEAVED;
  } else {
    for (int i = 0; i < 3; ++i) {
      layout.section_units[i] = static_cast<int>(p.sections[i] / 2 / N);
      rot_units += layout.section_units[i];
    }
  }
  const int64_t units_per_head = rot_units + (p.head_dim - rot) / N;
  const int64_t heads = p.q.heads + (p.k.in ? p.k.heads : 0);
  const int64_t positions = p.batches * p.tokens;
  if (units_per_head * heads > INT_MAX || positions > INT_MAX) return cudaErrorInvalidConfiguration;
  layout.rot_units = static_cast<int>(rot_units);
  layout.units_per_head = static_cast<int>(units_per_head);
  const dim3 grid(static_cast<unsigned>(positions));
  if (p.interleaved) {
    rope_table_kernel<T, TT, N, true><<<grid, kTableThreads, 0, stream>>>(p, layout);
  } else {
    rope_table_kernel<T, TT, N, false><<<grid, kTableThreads, 0, stream>>>(p, layout);
  }
  return cudaGetLastError();
}

template <typename T, typename TT>
cudaError_t launch_table_typed(const RopeParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  return rope_vector(p) == kVec ? launch_table<T, TT, kVec>(p, stream)
                                : launch_table<T, TT, 1>(p, stream);
}

template <typename T>
cudaError_t launch_table_dtype(const RopeParams& p, cudaStream_t stream) {
  return p.table_dtype == p.dtype ? launch_table_typed<T, T>(p, stream)
                                  : launch_table_typed<T, float>(p, stream);
}

// ---------------------------------------------------------------------------------------
// LTX-Video rotation with angles computed in the kernel.

// cos and sin of freq * m. The angle (1e4-1e6 rad) is formed and reduced to [-pi, pi] in
// fp64; there the hardware sin/cos (abs error < 4e-7) is accurate enough for fp32 outputs
// and ~20x cheaper than sincosf, whose instruction count made this kernel compute-bound.
__device__ __forceinline__ void ltx_sincos(double freq, double m, float* sn, float* cs) {
  constexpr double kTwoPi = 6.283185307179586;
  constexpr double kInvTwoPi = 0.15915494309189535;
  const double angle = freq * m;
  const double turns = rint(angle * kInvTwoPi);
  __sincosf(static_cast<float>(fma(-turns, kTwoPi, angle)), sn, cs);
}

// W elements per vector read with accesses of A; rows with an odd D keep channel 0 apart
// (an identity channel: D % 6 is odd) and pair the rest from channel 1.
template <typename T, int W, int A, bool NORM>
__global__ void __launch_bounds__(kLtxThreads) ltx_rope_kernel(const LtxRopeParams p) {
  extern __shared__ double freq[];
  __shared__ float scratch[2][core::kMaxWarpsPerBlock];
  const int64_t nfreq = p.cols / 6;
  for (int64_t k = threadIdx.x; k < nfreq; k += kLtxThreads) {
    const double exponent = nfreq > 1 ? static_cast<double>(k) / static_cast<double>(nfreq - 1) : 0.0;
    freq[k] = pow(p.theta, exponent) * 1.5707963267948966;
  }
  __syncthreads();

  const int first = static_cast<int>(p.cols & 1);  // 1: channel 0 handled on its own
  const int64_t identity = p.cols % 6;
  const int64_t vectors = (p.cols - first) / W;
  const int64_t positions = p.batches * p.tokens;
  for (int64_t pos = blockIdx.x; pos < positions; pos += gridDim.x) {
    const int64_t b = pos / p.tokens;
    const int64_t s = pos - b * p.tokens;
    double m[3];  // 2 * g_a - 1 per axis
    if (p.coords) {
      const float* c = p.coords + b * p.coords_strides[0] + s * p.coords_strides[2];
#pragma unroll
      for (int a = 0; a < 3; ++a)
        m[a] = 2.0 * static_cast<double>(c[a * p.coords_strides[1]]) * p.axis_scale[a] - 1.0;
    } else {
      const int64_t hw = p.grid[1] * p.grid[2];
      const int64_t f = s / hw;
      const int64_t rest = s - f * hw;
      const int64_t h = rest / p.grid[2];
      const int64_t w = rest - h * p.grid[2];
      m[0] = 2.0 * static_cast<double>(f) * p.axis_scale[0] - 1.0;
      m[1] = 2.0 * static_cast<double>(h) * p.axis_scale[1] - 1.0;
      m[2] = 2.0 * static_cast<double>(w) * p.axis_scale[2] - 1.0;
    }
    const T* q = static_cast<const T*>(p.q) + pos * p.q_row_stride;
    const T* k = p.k ? static_cast<const T*>(p.k) + pos * p.k_row_stride : nullptr;
    T* q_out = static_cast<T*>(p.q_out) + pos * p.cols;
    T* k_out = p.k ? static_cast<T*>(p.k_out) + pos * p.cols : nullptr;

    float q_rstd = 1.0f, k_rstd = 1.0f;
    if constexpr (NORM) {
      float q_sq = 0.0f, k_sq = 0.0f;
      for (int64_t u = threadIdx.x; u < vectors; u += kLtxThreads) {
        const int64_t c = first + u * W;
        const Floats<W> xq = core::widen(core::load_cached_parts<T, W, A>(q + c));
#pragma unroll
        for (int j = 0; j < W; ++j) q_sq += xq.v[j] * xq.v[j];
        if (k) {
          const Floats<W> xk = core::widen(core::load_cached_parts<T, W, A>(k + c));
#pragma unroll
          for (int j = 0; j < W; ++j) k_sq += xk.v[j] * xk.v[j];
        }
      }
      if (first && threadIdx.x == 0) {
        const float xq = core::to_float(q[0]);
        q_sq += xq * xq;
        if (k) {
          const float xk = core::to_float(k[0]);
          k_sq += xk * xk;
        }
      }
      const float inv_cols = 1.0f / static_cast<float>(p.cols);
      q_rstd = rsqrtf(core::row_sum<kLtxThreads>(q_sq, scratch[0]) * inv_cols + p.eps);
      if (k) k_rstd = rsqrtf(core::row_sum<kLtxThreads>(k_sq, scratch[1]) * inv_cols + p.eps);
    }

    // x * rstd [* weight] in fp32.
    const auto normed = [&](const T* row, const T* weight, float rstd, int64_t c) {
      Floats<W> x = core::widen(core::load_cached_parts<T, W, A>(row + c));
      if constexpr (NORM) {
        Floats<W> wt;
        if (weight) wt = core::widen(core::load_cached_parts<T, W, A>(weight + c));
#pragma unroll
        for (int j = 0; j < W; ++j) x.v[j] = x.v[j] * rstd * (weight ? wt.v[j] : 1.0f);
      }
      return x;
    };
    const T* qw = static_cast<const T*>(p.q_weight);
    const T* kw = static_cast<const T*>(p.k_weight);
    for (int64_t u = threadIdx.x; u < vectors; u += kLtxThreads) {
      const int64_t c = first + u * W;
      Floats<W> xq = normed(q, qw, q_rstd, c);
      Floats<W> xk;
      if (k) xk = normed(k, kw, k_rstd, c);
#pragma unroll
      for (int j = 0; j < W; j += 2) {
        if (c + j < identity) continue;
        // 32-bit index math (a row has < 2^31 channels): 64-bit division is emulated.
        const unsigned pair = static_cast<unsigned>(c + j - identity) / 2;
        const unsigned fk = pair / 3;
        const unsigned axis = pair - fk * 3;
        float sn, cs;
        ltx_sincos(freq[fk], axis == 0 ? m[0] : axis == 1 ? m[1] : m[2], &sn, &cs);
        const float q0 = xq.v[j], q1 = xq.v[j + 1];
        xq.v[j] = q0 * cs - q1 * sn;
        xq.v[j + 1] = q1 * cs + q0 * sn;
        if (k) {
          const float k0 = xk.v[j], k1 = xk.v[j + 1];
          xk.v[j] = k0 * cs - k1 * sn;
          xk.v[j + 1] = k1 * cs + k0 * sn;
        }
      }
      core::store_parts<T, W, A>(q_out + c, core::narrow<T>(xq));
      if (k) core::store_parts<T, W, A>(k_out + c, core::narrow<T>(xk));
    }
    if (first && threadIdx.x == 0) {  // channel 0 of an odd row: identity
      const float wq = NORM && qw ? core::to_float(qw[0]) : 1.0f;
      q_out[0] = core::from_float<T>(core::to_float(q[0]) * q_rstd * wq);
      if (k) {
        const float wk = NORM && kw ? core::to_float(kw[0]) : 1.0f;
        k_out[0] = core::from_float<T>(core::to_float(k[0]) * k_rstd * wk);
      }
    }
    // The next token reuses the reduction scratch.
    if constexpr (NORM) __syncthreads();
  }
}

template <typename T, int W, int A>
cudaError_t launch_ltx_shape(const LtxRopeParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(p.cols / 6) * sizeof(double);
  const auto kernel = p.norm ? ltx_rope_kernel<T, W, A, true> : ltx_rope_kernel<T, W, A, false>;
  if (smem > 48 * 1024) {
    // Beyond the default dynamic shared memory (D > 36864); fails for a table larger
    // than the SM's shared memory, which the launch then reports.
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kLtxThreads, smem);
  if (e != cudaSuccess) return e;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  const int64_t positions = p.batches * p.tokens;
  const int64_t resident = static_cast<int64_t>(sms) * per_sm;
  const unsigned blocks = static_cast<unsigned>(positions < resident ? positions : resident);
  kernel<<<blocks, kLtxThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_ltx_typed(const LtxRopeParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  // 16-byte vectors when every row start is aligned; else pairs read one element at a time.
  const bool vec = p.cols % kVec == 0 && p.q_row_stride % kVec == 0 && aligned16(p.q) &&
                   aligned16(p.q_out) && aligned16(p.q_weight) &&
                   (!p.k || (p.k_row_stride % kVec == 0 && aligned16(p.k) && aligned16(p.k_out))) &&
                   aligned16(p.k_weight);
  return vec ? launch_ltx_shape<T, kVec, kVec>(p, stream) : launch_ltx_shape<T, 2, 1>(p, stream);
}

}  // namespace

cudaError_t launch(const RopeParams& p, cudaStream_t stream) {
  if (validate(p) != nullptr) return cudaErrorInvalidValue;
  if (p.batches == 0 || p.tokens == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32: return launch_table_typed<float, float>(p, stream);
    case DType::kFloat16: return launch_table_dtype<__half>(p, stream);
    case DType::kBFloat16: return launch_table_dtype<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch(const LtxRopeParams& p, cudaStream_t stream) {
  if (validate(p) != nullptr) return cudaErrorInvalidValue;
  if (p.batches == 0 || p.tokens == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32: return launch_ltx_typed<float>(p, stream);
    case DType::kFloat16: return launch_ltx_typed<__half>(p, stream);
    case DType::kBFloat16: return launch_ltx_typed<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx_kernels

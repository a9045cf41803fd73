// CUDA kernels and launcher of group_norm (include/ltx_kernels/group_norm.h).
//
// A group of a UNet is large (SDXL at 1024²: 10 channels x 16384 positions) and there are few
// of them (64 per call at batch 2): one block per group would leave most SMs idle. So three
// short kernels:
//   1. stats: partial (mean, M2) of each channel over a segment of its positions, many
//      segments at once (a warp per row segment channels-first; channels-last a block per
//      chunk of channel vectors x segment, the apply pass's walk: 16-byte vectors of adjacent
//      channels, a block reading whole positions' channels, contiguous, per step);
//   2. finalize: one block per (sample, group) merges its channels' partials (Chan's formula,
//      exact for any mean) and writes each channel's (mean - add, rstd * weight, bias);
//   3. apply: one elementwise pass over x, 16-byte vectors where aligned (channels-first in
//      memory order; channels-last each thread on one vector of channels across positions,
//      its coefficients in registers).
// x is read twice (stats, apply), as torch's own GroupNorm kernels and torch.compile's do; the
// stats pass reads it with the default cache policy (not evict-first), so that where x fits
// in L2 (SDXL's largest level at batch 2: 21 MB) the apply pass reads it from there.
// Partial sums are taken around a shift (the segment's first element), so that a large mean
// costs no precision: M2 = sum (x - k)^2 - (sum (x - k))^2 / n with k near the data.
#include <algorithm>
#include <cstdint>

#include "core/activation.cuh"
#include "core/convert.cuh"
#include "core/reduce.cuh"
#include "core/vec.cuh"
#include "ltx_kernels/group_norm.h"
#include "ops/host_util.h"

namespace ltx_kernels {
namespace {

using host_util::ceil_div;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Channels-first: about kRowWarps stats warps a call (a few waves of 8-warp blocks), each
// segment at least kMinRowSegment positions and a multiple of 8 (each starts 16-byte aligned).
constexpr int64_t kRowWarps = 4096;
constexpr int64_t kMinRowSegment = 1024;
// Channels-last: the stats blocks wanted per call (a few per SM; the segment length follows).
constexpr int64_t kColBlocks = 512;

// kUnroll vectors of a thread loaded before any is computed: enough bytes in flight per SM for
// a pass at memory speed.
constexpr int kUnroll = 4;

// How a channels-last pass lays a block over the channels: `chunks` blocks across a position's
// channel vectors, `width` <= max_width vectors each (chunks of equal width), `rows` positions
// per step.
struct ColTiling {
  int width, rows;
  int64_t chunks;
};

ColTiling col_tiling(int64_t vectors, int max_width) {
  const int64_t chunks = ceil_div(vectors, max_width);
  const int width = static_cast<int>(ceil_div(vectors, chunks));
  return {width, kThreads / width, chunks};
}

// The stats pass takes at most a warp's worth of vectors across (512 contiguous bytes of a
// position, 16-bit) and so 8 or more positions per step: a small map still spreads over many
// blocks (SDXL's 32x32 level: 5 chunks of 1280 channels). The apply pass takes a position's
// channels whole where they fit, its coefficients loaded once per thread.
constexpr int kStatsWidth = 32;
constexpr int kApplyWidth = kThreads;

// The positions of a sample split into `segments` segments of `segment` positions (the last
// one shorter), each reduced to one partial per channel.
struct Split {
  int64_t segments, segment;
};

// The partial statistics of one segment: its mean and M2 (count implied by the segment).
struct __align__(8) Partial {
  float mean, m2;
};

// Positions in segment `k` of `segment` positions each.
__device__ __forceinline__ int64_t segment_count(int64_t spatial, int64_t segment, int64_t k) {
  return min(segment, spatial - k * segment);
}

// Channels-first: warp w of the grid takes row (n, c) = w / segments, positions
// [k * segment, ...) with k = w % segments.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) stats_rows_kernel(const GroupNormParams p, Partial* partials,
                                                               const Split split) {
  const int64_t segments = split.segments;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= p.batch * p.channels * segments) return;
  const int64_t row = warp / segments, k = warp % segments;
  const int64_t count = segment_count(p.spatial, split.segment, k);
  const T* x = static_cast<const T*>(p.x) + row * p.spatial + k * split.segment;
  const float shift = core::to_float(x[0]);
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t i = lane * VEC; i < count; i += 32 * VEC) {
    const core::Floats<VEC> v = core::widen(core::load_cached<T, VEC>(x + i));
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float d = v.v[e] - shift;
      s1 += d;
      s2 = fmaf(d, d, s2);
    }
  }
  s1 = core::warp_reduce(s1, core::Sum());
  s2 = core::warp_reduce(s2, core::Sum());
  if (lane == 0) {
    const float n = static_cast<float>(count);
    partials[warp] = {shift + s1 / n, fmaxf(s2 - s1 * (s1 / n), 0.0f)};
  }
}

// Channels-last: block (channel-vector chunk, segment k, sample n), looping over k and n past
// the grid's limits. Thread t keeps VEC adjacent channels, vector chunk * width + t % width,
// and walks the segment's positions t / width, + rows, ... (a block reads `rows` positions'
// channel vectors, contiguous in memory, per step); the rows' sums are then added in shared
// memory (one shift per channel: its value at the segment's first position).
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) stats_cols_kernel(const GroupNormParams p, Partial* partials,
                                                               const Split split, int width, int rows) {
  __shared__ float sums[2][VEC][kThreads];  // [sum][channel of the vector][thread]: no bank conflicts
  const int slot = threadIdx.x % width, row = threadIdx.x / width;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * width + slot) * VEC;
  const bool active = row < rows && c < p.channels;  // (channels % VEC == 0: all VEC or none)
  for (int64_t n = blockIdx.z; n < p.batch; n += gridDim.z) {
    for (int64_t k = blockIdx.y; k < split.segments; k += gridDim.y) {
      const int64_t count = segment_count(p.spatial, split.segment, k);
      const T* x = static_cast<const T*>(p.x) + (n * p.spatial + k * split.segment) * p.channels + c;
      float shift[VEC] = {}, s1[VEC] = {}, s2[VEC] = {};
      if (active) {
        const core::Floats<VEC> first = core::widen(core::load_cached<T, VEC>(x));
#pragma unroll
        for (int e = 0; e < VEC; ++e) shift[e] = first.v[e];
        for (int64_t s0 = row; s0 < count; s0 += static_cast<int64_t>(rows) * kUnroll) {
          core::Vec<T, VEC> raw[kUnroll];  // (16-bit until used: half the registers of fp32)
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int64_t s = s0 + u * rows;
            if (s < count) raw[u] = core::load_cached<T, VEC>(x + s * p.channels);
          }
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            if (s0 + u * rows >= count) continue;
            const core::Floats<VEC> v = core::widen(raw[u]);
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              const float d = v.v[e] - shift[e];
              s1[e] += d;
              s2[e] = fmaf(d, d, s2[e]);
            }
          }
        }
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) sums[0][e][threadIdx.x] = s1[e], sums[1][e][threadIdx.x] = s2[e];
      __syncthreads();
      if (row == 0 && active) {
        const float n_f = static_cast<float>(count);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          float t1 = 0.0f, t2 = 0.0f;
          for (int r = 0; r < rows; ++r) t1 += sums[0][e][r * width + slot], t2 += sums[1][e][r * width + slot];
          partials[(n * p.channels + c + e) * split.segments + k] = {shift[e] + t1 / n_f,
                                                                     fmaxf(t2 - t1 * (t1 / n_f), 0.0f)};
        }
      }
      __syncthreads();  // sums is written again by the next segment
    }
  }
}

// Per channel of each sample: out = (x - center) * factor + bias.
struct __align__(16) Coef {
  float center, factor, bias, unused;
};

template <typename W>
__device__ __forceinline__ float param(const void* ptr, int64_t c, float absent) {
  return ptr ? core::to_float(static_cast<const W*>(ptr)[c]) : absent;
}

// One block per (sample n, group g): the group's channels' segments (hundreds a channel at a
// large level channels-last), merged by Chan's formula in two passes (the mean, then M2
// around it); then each channel's coefficients. (A one-pass pairwise merge of (count, mean,
// M2) measured 1-2 us slower on the H200 at every shape: a division per merge.)
template <typename T, typename W>
__global__ void __launch_bounds__(kThreads) finalize_kernel(const GroupNormParams p, const Partial* partials,
                                                             const Split split, Coef* coefs) {
  __shared__ float scratch[2][core::kMaxWarpsPerBlock];
  const int64_t item = blockIdx.x;
  const int64_t segments = split.segments, segment = split.segment;
  const int64_t n = item / p.groups, per_group = p.channels / p.groups, c0 = item % p.groups * per_group;
  const int64_t parts = per_group * segments;
  const Partial* first = partials + (n * p.channels + c0) * segments;
  const T* add = p.add ? static_cast<const T*>(p.add) + n * p.channels : nullptr;
  // Part i: channel c0 + i / segments, segment i % segments; its mean with the channel's add.
  const auto mean_of = [&](int64_t i) {
    const float m = first[i].mean;
    return add ? m + core::to_float(add[c0 + i / segments]) : m;
  };
  // Around the first part's mean, so that a large common mean does not swamp the sum.
  const float ref = mean_of(0);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < parts; i += kThreads) {
    sum += static_cast<float>(segment_count(p.spatial, segment, i % segments)) * (mean_of(i) - ref);
  }
  const float total = static_cast<float>(per_group * p.spatial);
  const float mean = ref + core::row_sum<kThreads>(sum, scratch[0]) / total;
  float m2 = 0.0f;
  for (int64_t i = threadIdx.x; i < parts; i += kThreads) {
    const float d = mean_of(i) - mean;
    m2 += first[i].m2 + static_cast<float>(segment_count(p.spatial, segment, i % segments)) * d * d;
  }
  const float rstd = rsqrtf(core::row_sum<kThreads>(m2, scratch[1]) / total + p.eps);
  for (int64_t c = c0 + threadIdx.x; c < c0 + per_group; c += kThreads) {
    const float center = add ? mean - core::to_float(add[c]) : mean;
    coefs[n * p.channels + c] = {center, rstd * param<W>(p.weight, c, 1.0f), param<W>(p.bias, c, 0.0f), 0.0f};
  }
}

// y = (x - center) * factor + bias, then SiLU where asked.
template <int VEC>
__device__ __forceinline__ core::Floats<VEC> normalized(const core::Floats<VEC>& v, const float (&center)[VEC],
                                                        const float (&factor)[VEC], const float (&bias)[VEC],
                                                        bool silu) {
  core::Floats<VEC> y;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    y.v[e] = fmaf(v.v[e] - center[e], factor[e], bias[e]);
    if (silu) y.v[e] = core::silu(y.v[e]);
  }
  return y;
}

// Channels-first apply: one elementwise pass over x in memory order, a grid of a few waves of
// resident blocks looping over the rest; a vector lies in one channel (spatial % VEC == 0 or
// VEC 1). (A warp per row segment with the coefficients in registers, as the stats pass walks
// x, measured 0.9x of this at SDXL's shapes and 0.55x at an odd one on the H100.)
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) apply_rows_kernel(const GroupNormParams p, const Coef* coefs) {
  const int64_t total = p.batch * p.channels * p.spatial;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * VEC;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * VEC; i < total; i += stride) {
    const Coef k = coefs[i / p.spatial];
    float center[VEC], factor[VEC], bias[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) center[e] = k.center, factor[e] = k.factor, bias[e] = k.bias;
    const core::Floats<VEC> v = core::widen(core::load_stream<T, VEC>(static_cast<const T*>(p.x) + i));
    core::store(static_cast<T*>(p.out) + i, core::narrow<T, VEC>(normalized<VEC>(v, center, factor, bias, p.silu)));
  }
}

// Channels-last apply: block (channel-vector chunk, position chunk, sample n), looping over the
// positions and samples past the grid. Thread t keeps one vector of VEC adjacent channels,
// cv = chunk start + t % width, and its coefficients in registers (not one 16-byte Coef load per
// element from L1: 8x x's own bytes), and walks positions t / width, + rows, ...: a block
// reads `rows` positions' channel vectors, contiguous in memory, per step.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) apply_cols_kernel(const GroupNormParams p, const Coef* coefs, int width,
                                                               int rows) {
  const int64_t vectors = p.channels / VEC;  // per position
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * width + threadIdx.x % width;
  const int row = threadIdx.x / width;
  if (row >= rows || cv >= vectors) return;
  for (int64_t n = blockIdx.z; n < p.batch; n += gridDim.z) {
    float center[VEC], factor[VEC], bias[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const Coef coef = coefs[n * p.channels + cv * VEC + e];
      center[e] = coef.center, factor[e] = coef.factor, bias[e] = coef.bias;
    }
    const int64_t base = n * p.spatial * p.channels + cv * VEC;
    const T* x = static_cast<const T*>(p.x) + base;
    T* out = static_cast<T*>(p.out) + base;
    const int64_t step = static_cast<int64_t>(gridDim.y) * rows;
    for (int64_t s0 = static_cast<int64_t>(blockIdx.y) * rows + row; s0 < p.spatial; s0 += step * kUnroll) {
      core::Vec<T, VEC> raw[kUnroll];  // (16-bit until used: half the registers of fp32)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t s = s0 + u * step;
        if (s < p.spatial) raw[u] = core::load_stream<T, VEC>(x + s * p.channels);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t s = s0 + u * step;
        if (s < p.spatial) {
          const core::Floats<VEC> y = normalized<VEC>(core::widen(raw[u]), center, factor, bias, p.silu);
          core::store(out + s * p.channels, core::narrow<T, VEC>(y));
        }
      }
    }
  }
}

// The elements of a 16-byte vector of x.
int vector_elements(const GroupNormParams& p) { return p.dtype == DType::kFloat32 ? 4 : 8; }

// Channels-first: about kRowWarps warps of at least kMinRowSegment positions. Channels-last:
// about kColBlocks blocks of the 16-byte tiling (the shape decides it, not the alignment: the
// workspace is sized from it), each thread at least kUnroll positions.
Split split_of(const GroupNormParams& p) {
  if (!p.channels_last) {
    const int64_t wanted = ceil_div(kRowWarps, p.batch * p.channels);
    const int64_t segment = ceil_div(std::max(ceil_div(p.spatial, wanted), kMinRowSegment), int64_t{8}) * 8;
    return {ceil_div(p.spatial, segment), segment};
  }
  const ColTiling tiling = col_tiling(ceil_div(p.channels, vector_elements(p)), kStatsWidth);
  const int64_t wanted = ceil_div(kColBlocks, tiling.chunks * p.batch);
  const int64_t segment = std::max(ceil_div(p.spatial, wanted), int64_t{tiling.rows} * kUnroll);
  return {ceil_div(p.spatial, segment), segment};  // (no empty segment)
}

// The workspace: the partials, then (16-byte aligned) the coefficients.
int64_t partial_floats(const GroupNormParams& p) {
  return ceil_div(2 * p.batch * p.channels * split_of(p).segments, 4) * 4;
}

template <typename T, typename W>
cudaError_t launch_typed(const GroupNormParams& p, float* workspace, cudaStream_t stream) {
  const Split split = split_of(p);
  const int64_t segments = split.segments;
  Partial* partials = reinterpret_cast<Partial*>(workspace);
  Coef* coefs = reinterpret_cast<Coef*>(workspace + partial_floats(p));
  constexpr int kVec = 16 / sizeof(T);
  // (every pointer from torch's allocator or a checked view: 16-byte alignment is checked)
  const bool aligned = host_util::aligned16(p.x) && host_util::aligned16(p.out);
  constexpr int64_t kMaxGridYZ = 65535;
  if (p.channels_last) {
    // 16-byte vectors of channels where channels and x allow it, else pairs of 16-bit
    // channels (4-byte loads), else single ones.
    constexpr int kPair = 4 / static_cast<int>(sizeof(T));
    const bool vectors = aligned && p.channels % kVec == 0;
    const bool pairs = p.channels % kPair == 0 && reinterpret_cast<uintptr_t>(p.x) % 4 == 0;
    const int vec = vectors ? kVec : pairs ? kPair : 1;
    const ColTiling tiling = col_tiling(p.channels / vec, kStatsWidth);
    const dim3 grid(static_cast<unsigned>(tiling.chunks), static_cast<unsigned>(std::min(segments, kMaxGridYZ)),
                    static_cast<unsigned>(std::min(p.batch, kMaxGridYZ)));
    if (vectors) {
      stats_cols_kernel<T, kVec><<<grid, kThreads, 0, stream>>>(p, partials, split, tiling.width, tiling.rows);
    } else if (pairs) {
      stats_cols_kernel<T, kPair><<<grid, kThreads, 0, stream>>>(p, partials, split, tiling.width, tiling.rows);
    } else {
      stats_cols_kernel<T, 1><<<grid, kThreads, 0, stream>>>(p, partials, split, tiling.width, tiling.rows);
    }
  } else {
    const unsigned blocks = static_cast<unsigned>(ceil_div(p.batch * p.channels * segments, kWarps));
    if (aligned && p.spatial % kVec == 0) {
      stats_rows_kernel<T, kVec><<<blocks, kThreads, 0, stream>>>(p, partials, split);
    } else {
      stats_rows_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(p, partials, split);
    }
  }
  finalize_kernel<T, W><<<static_cast<unsigned>(p.batch * p.groups), kThreads, 0, stream>>>(p, partials, split, coefs);
  int device = 0, sms = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error != cudaSuccess) return error;
  const bool vectorize = aligned && (p.channels_last ? p.channels : p.spatial) % kVec == 0;
  if (!p.channels_last) {
    const int64_t vectors = ceil_div(p.batch * p.channels * p.spatial, vectorize ? kVec : 1);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(vectors, kThreads), int64_t{sms} * 8));
    if (vectorize) {
      apply_rows_kernel<T, kVec><<<grid, kThreads, 0, stream>>>(p, coefs);
    } else {
      apply_rows_kernel<T, 1><<<grid, kThreads, 0, stream>>>(p, coefs);
    }
    return cudaGetLastError();
  }
  // Channels-last: blocks of `rows` positions x `width` channel vectors, enough position
  // chunks for a few waves of resident blocks.
  const ColTiling tiling = col_tiling(p.channels / (vectorize ? kVec : 1), kApplyWidth);
  const int64_t batch = std::min(p.batch, kMaxGridYZ);
  // Blocks along the positions: a few waves, but (where that still leaves two blocks an SM)
  // each thread at least kApplyPositions positions: its coefficients, 16 bytes a channel, are
  // loaded once per sample.
  constexpr int64_t kApplyPositions = 4 * kUnroll;
  const int64_t wanted = ceil_div(int64_t{sms} * 8, tiling.chunks * batch);
  const int64_t most = std::max(ceil_div(p.spatial, int64_t{tiling.rows} * kApplyPositions),
                                ceil_div(int64_t{sms} * 2, tiling.chunks * batch));
  const int64_t blocks = std::min({wanted, most, ceil_div(p.spatial, int64_t{tiling.rows})});
  const dim3 grid(static_cast<unsigned>(tiling.chunks),
                  static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxGridYZ)), static_cast<unsigned>(batch));
  if (vectorize) {
    apply_cols_kernel<T, kVec><<<grid, kThreads, 0, stream>>>(p, coefs, tiling.width, tiling.rows);
  } else {
    apply_cols_kernel<T, 1><<<grid, kThreads, 0, stream>>>(p, coefs, tiling.width, tiling.rows);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_weights(const GroupNormParams& p, float* workspace, cudaStream_t stream) {
  return p.weight_dtype == DType::kFloat32 ? launch_typed<T, float>(p, workspace, stream)
                                           : launch_typed<T, T>(p, workspace, stream);
}

}  // namespace

int64_t workspace_floats(const GroupNormParams& p) {
  return partial_floats(p) + 4 * p.batch * p.channels;
}

cudaError_t launch(const GroupNormParams& p, float* workspace, cudaStream_t stream) {
  if (validate(p) != nullptr || workspace == nullptr) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.spatial == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32: return launch_typed<float, float>(p, workspace, stream);
    case DType::kFloat16: return launch_weights<__half>(p, workspace, stream);
    case DType::kBFloat16: return launch_weights<__nv_bfloat16>(p, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx_kernels

// The decode kernel of attention (ops/attention_workspace.h: uses_decode_kernel): exact
// attention of a few query rows per kv head against many keys, as a decode step of an LLM asks
// (one token per sequence, its query heads grouped on their kv head). The keys of each
// (batch, kv head) are cut into chunks of kDecodeChunk; one CTA per chunk computes all of the
// head's query rows against it (each key row is read once for the whole group of query heads,
// where a kernel per query head, or transformers' repeat_kv, reads it once per head), leaving
// each row's max, sum of exponentials and unnormalized output; a second kernel combines the
// chunks (FlashDecoding). Memory-bound: no tensor cores. Within a CTA each warp walks every
// kWarps-th key of the chunk: its 32 lanes read the key's row (D / 32 elements each), a warp
// reduction gives each query row's score, and the online softmax runs per row in fp32, scores
// in log2 units. The warps' partial results are then combined in shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "core/convert.cuh"
#include "ltx_kernels/attention.h"
#include "ops/attention_decode.h"
#include "ops/attention_workspace.h"
#include "ops/host_util.h"

namespace ltx_kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = static_cast<int>(kDecodeMaxRows);
constexpr float kLog2e = 1.4426950408889634f;

// Query row r of a kv head: query token r / group of query head hk * group + r % group.
struct Row {
  int token, head;
};
__device__ __forceinline__ Row row_of(int r, int group, int hk) { return {r / group, hk * group + r % group}; }

// D / 32 consecutive elements of a row (the lane's share) in fp32, one 4- or 8-byte load (rows
// start 16-byte aligned: cuda_support).
template <typename T, int E>
__device__ __forceinline__ void load_lane(float (&x)[E], const T* row, int lane) {
  static_assert(E == 2 || E == 4);
  using Vec = std::conditional_t<E == 4, uint2, uint32_t>;
  const Vec raw = *reinterpret_cast<const Vec*>(row + E * lane);
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] = core::to_float(v[e]);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_decode_kernel(const AttentionParams p, const AttentionWorkspace w) {
  constexpr int E = D / 32;  // elements of a row per lane
  __shared__ float warp_max[kWarps][kRows], warp_sum[kWarps][kRows];
  __shared__ float warp_out[kWarps][kRows][D];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z;
  const int hk = blockIdx.y, chunk = blockIdx.x;
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const int rows = static_cast<int>(p.seq_q) * group;
  const float factor = p.scale * kLog2e;

  float q[kRows][E];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r < rows) {
      const Row at = row_of(r, group, hk);
      load_lane(q[r], static_cast<const T*>(p.q) + b * p.q_strides.batch + at.head * p.q_strides.head +
                          at.token * p.q_strides.seq, lane);
#pragma unroll
      for (int e = 0; e < E; ++e) q[r][e] *= factor;
    }
  }
  const T* k = static_cast<const T*>(p.k) + b * p.k_strides.batch + hk * p.k_strides.head;
  const T* v = static_cast<const T*>(p.v) + b * p.v_strides.batch + hk * p.v_strides.head;
  const float* mask = p.mask ? p.mask + b * p.mask_strides.batch : nullptr;

  // Per row: running max (log2 units), sum of exponentials, this lane's output share. A NaN
  // score leaves the max as it is (fmaxf) and makes the sum NaN, which every later step keeps.
  float row_max[kRows], row_sum[kRows], o[kRows][E];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) o[r][e] = 0.0f;
  }
  const int first = chunk * static_cast<int>(kDecodeChunk);
  const int last = min(first + static_cast<int>(kDecodeChunk), static_cast<int>(p.seq_k));
#pragma unroll 4  // (loads of later keys in flight while one key's scores reduce)
  for (int key = first + warp; key < last; key += kWarps) {
    float kx[E], vx[E];
    load_lane(kx, k + key * p.k_strides.seq, lane);
    load_lane(vx, v + key * p.v_strides.seq, lane);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= rows) continue;  // (uniform across the CTA)
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) s = fmaf(q[r][e], kx[e], s);
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
      if (mask != nullptr) {
        const Row at = row_of(r, group, hk);
        s += mask[at.head * p.mask_strides.head + at.token * p.mask_strides.seq + key] * kLog2e;
      }
      if (s == -INFINITY) continue;  // a masked key adds nothing
      const float new_max = fmaxf(row_max[r], s);
      const float alpha = exp2f(row_max[r] - new_max);  // 0 from -inf; 1 where the max stays
      const float weight = exp2f(s - new_max);
      row_max[r] = new_max;
      row_sum[r] = fmaf(row_sum[r], alpha, weight);
#pragma unroll
      for (int e = 0; e < E; ++e) o[r][e] = fmaf(o[r][e], alpha, weight * vx[e]);
    }
  }

  // The warps' results, combined per row in shared memory.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= rows) continue;
    if (lane == 0) {
      warp_max[warp][r] = row_max[r];
      warp_sum[warp][r] = row_sum[r];
    }
#pragma unroll
    for (int e = 0; e < E; ++e) warp_out[warp][r][E * lane + e] = o[r][e];
  }
  __syncthreads();
  const int64_t part = ((b * p.heads_kv + hk) * w.decode_chunks + chunk) * kRows;
  for (int i = threadIdx.x; i < rows * D; i += kThreads) {
    const int r = i / D, d = i % D;
    float top = -INFINITY;
#pragma unroll
    for (int x = 0; x < kWarps; ++x) top = fmaxf(top, warp_max[x][r]);
    float sum = 0.0f, out = 0.0f;
    if (top != -INFINITY) {
#pragma unroll
      for (int x = 0; x < kWarps; ++x) {
        const float scale = exp2f(warp_max[x][r] - top);
        sum = fmaf(warp_sum[x][r], scale, sum);
        out = fmaf(warp_out[x][r][d], scale, out);
      }
    } else {
#pragma unroll
      for (int x = 0; x < kWarps; ++x) sum += warp_sum[x][r];  // 0, or NaN
    }
    w.part_out[(part + r) * D + d] = out;
    if (d == 0) {
      w.part_max[part + r] = top;
      w.part_sum[part + r] = sum;
    }
  }
}

// The chunks' partial results of one (batch, kv head), combined: out = sum_c o_c 2^(m_c - M) /
// sum_c l_c 2^(m_c - M), M the largest m_c; a row every key of which is masked gets zeros, a
// row that met a NaN score NaN.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_decode_combine_kernel(const AttentionParams p,
                                                                           const AttentionWorkspace w) {
  const int64_t b = blockIdx.y;
  const int hk = blockIdx.x;
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const int rows = static_cast<int>(p.seq_q) * group;
  const int64_t base = (b * p.heads_kv + hk) * w.decode_chunks * kRows;
  for (int i = threadIdx.x; i < rows * D; i += kThreads) {
    const int r = i / D, d = i % D;
    float top = -INFINITY;
    for (int64_t c = 0; c < w.decode_chunks; ++c) top = fmaxf(top, w.part_max[base + c * kRows + r]);
    float sum = 0.0f, out = 0.0f;
    for (int64_t c = 0; c < w.decode_chunks; ++c) {
      const int64_t at = base + c * kRows + r;
      const float scale = top == -INFINITY ? 0.0f : exp2f(w.part_max[at] - top);
      sum = fmaf(w.part_sum[at], scale, sum);  // (a NaN sum stays NaN, even times 0)
      out = fmaf(w.part_out[at * D + d], scale, out);
    }
    const Row at = row_of(r, group, hk);
    const float value = sum == 0.0f ? 0.0f : out / sum;  // NaN sums propagate
    static_cast<T*>(p.out)[b * p.out_strides.batch + at.head * p.out_strides.head + at.token * p.out_strides.seq + d] =
        core::from_float<T>(value);
  }
}

template <typename T, int D>
cudaError_t launch_typed(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(w.decode_chunks), static_cast<unsigned>(p.heads_kv),
                  static_cast<unsigned>(p.batch));
  attention_decode_kernel<T, D><<<grid, kThreads, 0, stream>>>(p, w);
  attention_decode_combine_kernel<T, D>
      <<<dim3(static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch)), kThreads, 0, stream>>>(p, w);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dim(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  return p.head_dim == 64 ? launch_typed<T, 64>(p, w, stream) : launch_typed<T, 128>(p, w, stream);
}

}  // namespace

cudaError_t launch_decode(const AttentionParams& p, void* workspace, cudaStream_t stream) {
  if (!uses_decode_kernel(p) || workspace == nullptr) return cudaErrorInvalidValue;
  const AttentionWorkspace w = attention_workspace(p, workspace);
  return p.dtype == DType::kBFloat16 ? launch_dim<__nv_bfloat16>(p, w, stream) : launch_dim<__half>(p, w, stream);
}

}  // namespace ltx_kernels

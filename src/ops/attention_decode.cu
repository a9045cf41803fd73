// The decode kernel of attention (ops/attention_workspace.h: uses_decode_kernel): exact
// attention of a few query rows per kv head against many keys, as a decode step of an LLM asks
// (one token per sequence, its query heads grouped on their kv head). Memory-bound: the time is
// reading K and V once, so the keys of each (batch, kv head) are cut into chunks of
// kDecodeChunk, one CTA per chunk (a Llama-3-8B step against 8192 keys: 1024 CTAs on 8 kv
// heads), and each CTA puts all its loads in flight at once: the chunk's K and V rows go to
// shared memory by cp.async before any arithmetic. Then, for every query row of the head (each
// key read once for the whole group of query heads, where transformers' repeat_kv + SDPA reads
// it once per query head): scores (a warp per key, lanes along the head dim, a warp reduction),
// the chunk's softmax per row in fp32 (log2 units), and P V (a thread per output column). Each
// CTA leaves its rows' max, sum of exponentials and unnormalized output; a second kernel
// combines the chunks (FlashDecoding).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "core/convert.cuh"
#include "core/mma.cuh"
#include "ltx_kernels/attention.h"
#include "ops/attention_decode.h"
#include "ops/attention_workspace.h"

namespace ltx_kernels {
namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kRows = static_cast<int>(kDecodeMaxRows);
constexpr int kChunk = static_cast<int>(kDecodeChunk);
constexpr float kLog2e = 1.4426950408889634f;

// Query row r of a kv head: query token r / group of query head hk * group + r % group.
struct Row {
  int token, head;
};
__device__ __forceinline__ Row row_of(int r, int group, int hk) { return {r / group, hk * group + r % group}; }

template <typename T, int D>
struct DecodeSmem {
  T k[kChunk][D];
  T v[kChunk][D];
  float q[kRows][D];     // scaled to log2 units; after the scores, the second key half's P V sums
  float p[kRows][kChunk];  // scores, then exp2(score - row max)
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_decode_kernel(const AttentionParams p, const AttentionWorkspace w) {
#ifdef LTX_KERNELS_SM80_CODE
  constexpr int kPieces = D * static_cast<int>(sizeof(T)) / 16;  // 16-byte pieces per row
  constexpr int E = D / 32;                                      // elements of a row per lane
  __shared__ __align__(16) DecodeSmem<T, D> smem;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t b = blockIdx.z;
  const int hk = blockIdx.y, chunk = blockIdx.x;
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const int rows = static_cast<int>(p.seq_q) * group;
  const int first = chunk * kChunk;
  const int count = min(kChunk, static_cast<int>(p.seq_k) - first);

  // K, then V, in flight together (two commit groups, so the scores start once K is in).
  const T* k = static_cast<const T*>(p.k) + b * p.k_strides.batch + hk * p.k_strides.head + first * p.k_strides.seq;
  const T* v = static_cast<const T*>(p.v) + b * p.v_strides.batch + hk * p.v_strides.head + first * p.v_strides.seq;
  for (int i = tid; i < count * kPieces; i += kThreads) {
    const int key = i / kPieces, piece = i % kPieces;
    core::cp_async_16(core::smem_addr(&smem.k[key][8 * piece]), k + key * p.k_strides.seq + 8 * piece, true);
  }
  core::cp_async_commit();
  for (int i = tid; i < count * kPieces; i += kThreads) {
    const int key = i / kPieces, piece = i % kPieces;
    core::cp_async_16(core::smem_addr(&smem.v[key][8 * piece]), v + key * p.v_strides.seq + 8 * piece, true);
  }
  core::cp_async_commit();

  const float factor = p.scale * kLog2e;
  for (int i = tid; i < rows * D; i += kThreads) {
    const int r = i / D, d = i % D;
    const Row at = row_of(r, group, hk);
    smem.q[r][d] = factor * core::to_float(static_cast<const T*>(p.q)[b * p.q_strides.batch + at.head * p.q_strides.head +
                                                                       at.token * p.q_strides.seq + d]);
  }
  core::cp_async_wait<1>();
  __syncthreads();

  // Scores: warp w takes keys w, w + kWarps, ...; lane l holds elements [E l, E l + E) of the
  // key and of each query row (consecutive lanes, consecutive banks).
  const float* mask = p.mask ? p.mask + b * p.mask_strides.batch + first : nullptr;
  for (int key = warp; key < count; key += kWarps) {
    float kx[E];
#pragma unroll
    for (int e = 0; e < E; ++e) kx[e] = core::to_float(smem.k[key][E * lane + e]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= rows) break;  // (uniform across the CTA)
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) s = fmaf(smem.q[r][E * lane + e], kx[e], s);
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
      if (lane == 0) {
        if (mask != nullptr) {
          const Row at = row_of(r, group, hk);
          s += mask[at.head * p.mask_strides.head + at.token * p.mask_strides.seq + key] * kLog2e;
        }
        smem.p[r][key] = s;
      }
    }
  }
  __syncthreads();

  // The chunk's softmax: warp w takes rows w, w + kWarps, ...; lane l keys l, l + 32. The max
  // skips NaN scores (fmaxf) and their exponentials are NaN, so a NaN reaches the row's sum; a
  // masked key (-inf) adds 0, also where every key of the row is masked (max -inf).
  const int64_t part = ((b * p.heads_kv + hk) * w.decode_chunks + chunk) * kRows;
  for (int r = warp; r < rows; r += kWarps) {
    float top = -INFINITY;
    for (int key = lane; key < count; key += 32) top = fmaxf(top, smem.p[r][key]);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
    float sum = 0.0f;
    for (int key = lane; key < kChunk; key += 32) {
      const float s = key < count ? smem.p[r][key] : -INFINITY;
      const float e = s == -INFINITY ? 0.0f : exp2f(s - top);
      smem.p[r][key] = e;  // (0 past the chunk's keys: P V's loop runs over whole groups of 4)
      sum += e;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      w.part_max[part + r] = top;
      w.part_sum[part + r] = sum;
    }
  }
  core::cp_async_wait<0>();
  __syncthreads();

  // P V: thread t takes column t % D of every row over key half t / D (head dim 64: two halves,
  // the second's sums added through shared memory). V rows past the chunk's keys are not loaded:
  // their P is 0, but 0 times whatever the shared memory held may be NaN, so they are skipped.
  constexpr int kSplit = kThreads / D, kSplitKeys = kChunk / kSplit;
  const int d = tid % D, half = tid / D;
  const int key0 = half * kSplitKeys, key1 = min(key0 + kSplitKeys, count);
  float o[kRows] = {};
  for (int key = key0; key < key1; ++key) {
    const float x = core::to_float(smem.v[key][d]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= rows) break;
      o[r] = fmaf(smem.p[r][key], x, o[r]);
    }
  }
  if constexpr (kSplit == 2) {
    if (half == 1) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        smem.q[r][d] = o[r];
      }
    }
    __syncthreads();
    if (half == 1) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= rows) break;
      o[r] += smem.q[r][d];
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= rows) break;
    w.part_out[(part + r) * D + d] = o[r];
  }
#endif
}

// The chunks' partial results of one query row of one (batch, kv head), combined: out = sum_c
// o_c 2^(m_c - M) / sum_c l_c 2^(m_c - M), M the largest m_c. Thread t takes column t % D over
// every kCombineGroups-th chunk (its own running max), then the groups merge in shared memory.
// A row every key of which is masked gets zeros, a row that met a NaN score NaN.
constexpr int kCombineThreads = 256;

template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads) attention_decode_combine_kernel(const AttentionParams p,
                                                                                  const AttentionWorkspace w) {
  constexpr int kGroups = kCombineThreads / D;
  __shared__ float group_max[kGroups], group_sum[kGroups][D], group_out[kGroups][D];
  const int r = blockIdx.x, hk = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int d = threadIdx.x % D, g = threadIdx.x / D;
  const int64_t base = (b * p.heads_kv + hk) * w.decode_chunks * kRows + r;
  float top = -INFINITY, sum = 0.0f, out = 0.0f;
#pragma unroll 4
  for (int64_t c = g; c < w.decode_chunks; c += kGroups) {
    const int64_t at = base + c * kRows;
    const float m = w.part_max[at], l = w.part_sum[at], x = w.part_out[at * D + d];
    const float new_top = fmaxf(top, m);
    // Factors of 0 where a max is -inf (nothing unmasked yet); a NaN sum stays NaN times 0.
    const float old_scale = top == -INFINITY ? 0.0f : exp2f(top - new_top);
    const float scale = m == -INFINITY ? 0.0f : exp2f(m - new_top);
    sum = sum * old_scale + l * scale;
    out = out * old_scale + x * scale;
    top = new_top;
  }
  if (d == 0) group_max[g] = top;
  group_sum[g][d] = sum;
  group_out[g][d] = out;
  __syncthreads();
  if (g != 0) return;
  float all = -INFINITY;
#pragma unroll
  for (int x = 0; x < kGroups; ++x) all = fmaxf(all, group_max[x]);
  sum = 0.0f;
  out = 0.0f;
#pragma unroll
  for (int x = 0; x < kGroups; ++x) {
    const float scale = group_max[x] == -INFINITY ? 0.0f : exp2f(group_max[x] - all);
    sum += group_sum[x][d] * scale;
    out += group_out[x][d] * scale;
  }
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const Row at = row_of(r, group, hk);
  const float value = sum == 0.0f ? 0.0f : out / sum;  // NaN sums propagate
  static_cast<T*>(p.out)[b * p.out_strides.batch + at.head * p.out_strides.head + at.token * p.out_strides.seq + d] =
      core::from_float<T>(value);
}

template <typename T, int D>
cudaError_t launch_typed(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  const unsigned rows = static_cast<unsigned>(p.seq_q * (p.heads_q / p.heads_kv));
  const dim3 grid(static_cast<unsigned>(w.decode_chunks), static_cast<unsigned>(p.heads_kv),
                  static_cast<unsigned>(p.batch));
  attention_decode_kernel<T, D><<<grid, kThreads, 0, stream>>>(p, w);
  attention_decode_combine_kernel<T, D>
      <<<dim3(rows, static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch)), kCombineThreads, 0, stream>>>(
          p, w);
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

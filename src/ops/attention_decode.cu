// The decode kernel of attention (ops/attention_workspace.h: uses_decode_kernel): exact
// attention of a few query rows per kv head against many keys, as a decode step of an LLM asks
// (one token per sequence, its query heads grouped on their kv head). Memory-bound: the time is
// reading K and V once, so the keys of each (batch, kv head) are cut into chunks of
// kDecodeChunk, one CTA per chunk (a Llama-3-8B step against 8192 keys: 1024 CTAs on 8 kv
// heads), and each CTA puts all its loads in flight at once: the chunk's K and V rows go to
// shared memory by cp.async before any arithmetic. Then, for every query row of the head (each
// key read once for the whole group of query heads, where transformers' repeat_kv + SDPA reads
// it once per query head): the scores (two threads per key, each half the head dim), the
// chunk's softmax per row in fp32 (log2 units), and P V (a thread per output column). The rows
// are a compile-time bucket (4, 8 or 16), so that their loops unroll into independent chains.
// Each CTA leaves its rows' max, sum of exponentials and unnormalized output; a second kernel
// combines the chunks (FlashDecoding).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "core/activation.cuh"
#include "core/convert.cuh"
#include "core/mma.cuh"
#include "ltx_kernels/attention.h"
#include "ops/attention_decode.h"
#include "ops/attention_workspace.h"

namespace ltx_kernels {
namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kMaxRows = static_cast<int>(kDecodeMaxRows);
constexpr int kChunk = static_cast<int>(kDecodeChunk);
static_assert(kThreads == 2 * kChunk, "two threads per key in the scores");
using core::kLog2e;

// Query row r of a kv head: query token r / group of query head hk * group + r % group.
struct Row {
  int token, head;
};
__device__ __forceinline__ Row row_of(int r, int group, int hk) { return {r / group, hk * group + r % group}; }

// K's rows are stored with their 16-byte pieces XOR-permuted by the key (piece ^ key % 8), so
// that the two threads of each of a warp's 16 keys, reading the same logical piece at once,
// spread over all banks; the query rows they multiply are then one broadcast per half.
__device__ __forceinline__ int k_piece(int key, int piece) { return piece ^ (key % 8); }

template <typename T, int D, int R>
struct DecodeSmem {
  T k[kChunk][D];        // pieces permuted (k_piece)
  T v[kChunk][D];
  float q[R][D];         // scaled to log2 units; rows past the head's are zeros
  float p[R][kChunk];    // scores, then exp2(score - row max)
};

template <typename T, int D, int R>
__global__ void __launch_bounds__(kThreads) attention_decode_kernel(const AttentionParams p, const AttentionWorkspace w) {
#ifdef LTX_KERNELS_SM80_CODE
  constexpr int kPieces = D * static_cast<int>(sizeof(T)) / 16;  // 16-byte pieces per row
  constexpr int kHalfPieces = kPieces / 2;
  __shared__ __align__(16) DecodeSmem<T, D, R> smem;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t b = blockIdx.z;
  const int hk = blockIdx.y, chunk = blockIdx.x;
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const int rows = static_cast<int>(p.seq_q) * group;  // <= R
  const int first = chunk * kChunk;
  const int count = min(kChunk, static_cast<int>(p.seq_k) - first);

  // K, then V, in flight together (two commit groups, so that the scores start once K is in);
  // rows past the keys are written as zeros (their P is 0, and 0 times zeros stays 0).
  const T* k = static_cast<const T*>(p.k) + b * p.k_strides.batch + hk * p.k_strides.head + first * p.k_strides.seq;
  const T* v = static_cast<const T*>(p.v) + b * p.v_strides.batch + hk * p.v_strides.head + first * p.v_strides.seq;
#pragma unroll
  for (int i = tid; i < kChunk * kPieces; i += kThreads) {
    const int key = i / kPieces, piece = i % kPieces;
    const bool valid = key < count;
    core::cp_async_16(core::smem_addr(&smem.k[key][8 * k_piece(key, piece)]),
                      valid ? k + key * p.k_strides.seq + 8 * piece : k, valid);
  }
  core::cp_async_commit();
#pragma unroll
  for (int i = tid; i < kChunk * kPieces; i += kThreads) {
    const int key = i / kPieces, piece = i % kPieces;
    const bool valid = key < count;
    core::cp_async_16(core::smem_addr(&smem.v[key][8 * piece]), valid ? v + key * p.v_strides.seq + 8 * piece : v,
                      valid);
  }
  core::cp_async_commit();

  const float factor = p.scale * kLog2e;
  for (int i = tid; i < R * D; i += kThreads) {
    const int r = i / D, d = i % D;
    float x = 0.0f;
    if (r < rows) {
      const Row at = row_of(r, group, hk);
      x = factor * core::to_float(static_cast<const T*>(p.q)[b * p.q_strides.batch + at.head * p.q_strides.head +
                                                              at.token * p.q_strides.seq + d]);
    }
    smem.q[r][d] = x;
  }
  core::cp_async_wait<1>();
  __syncthreads();

  // Scores: thread t takes half t % 2 of key t / 2's row, R independent dot products.
  {
    const int key = tid / 2, half = tid % 2;
    float s[R] = {};
#pragma unroll
    for (int j = 0; j < kHalfPieces; ++j) {
      const int piece = half * kHalfPieces + j;
      const uint4 raw = *reinterpret_cast<const uint4*>(&smem.k[key][8 * k_piece(key, piece)]);
      const T* kx = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float x = core::to_float(kx[e]);
#pragma unroll
        for (int r = 0; r < R; ++r) s[r] = fmaf(smem.q[r][8 * piece + e], x, s[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] += __shfl_xor_sync(0xffffffffu, s[r], 1);
    if (half == 0) {
      const float* mask = p.mask ? p.mask + b * p.mask_strides.batch + first + key : nullptr;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float x = s[r];
        if (mask != nullptr && r < rows) {
          const Row at = row_of(r, group, hk);
          if (key < count) x += mask[at.head * p.mask_strides.head + at.token * p.mask_strides.seq] * kLog2e;
        }
        smem.p[r][key] = key < count ? x : -INFINITY;
      }
    }
  }
  __syncthreads();

  // The chunk's softmax: warp w takes rows w, w + kWarps, ...; lane l keys l and l + 32. The
  // max skips NaN scores (fmaxf) and their exponentials are NaN, so a NaN reaches the row's
  // sum; a masked key (-inf) adds 0, also where every key of the row is masked (max -inf).
  static_assert(kChunk == 64);
  const int64_t part = ((b * p.heads_kv + hk) * w.decode_chunks + chunk) * kMaxRows;
#pragma unroll
  for (int r = warp; r < R; r += kWarps) {
    const float s0 = smem.p[r][lane], s1 = smem.p[r][lane + 32];
    float top = fmaxf(s0, s1);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
    const float e0 = s0 == -INFINITY ? 0.0f : exp2f(s0 - top);
    const float e1 = s1 == -INFINITY ? 0.0f : exp2f(s1 - top);
    smem.p[r][lane] = e0;
    smem.p[r][lane + 32] = e1;
    float sum = e0 + e1;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0 && r < rows) {
      w.part_max[part + r] = top;
      w.part_sum[part + r] = sum;
    }
  }
  core::cp_async_wait<0>();
  __syncthreads();

  // P V: thread t takes column t % D of every row over key half t / D (head dim 64: two
  // halves, the second's sums added through shared memory), four keys per step.
  constexpr int kSplit = kThreads / D, kSplitKeys = kChunk / kSplit;
  const int d = tid % D, half = tid / D;
  float o[R] = {};
#pragma unroll 4
  for (int key = half * kSplitKeys; key < (half + 1) * kSplitKeys; key += 4) {
    float x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = core::to_float(smem.v[key + i][d]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float4 pr = *reinterpret_cast<const float4*>(&smem.p[r][key]);
      o[r] = fmaf(pr.x, x[0], fmaf(pr.y, x[1], fmaf(pr.z, x[2], fmaf(pr.w, x[3], o[r]))));
    }
  }
  if constexpr (kSplit == 2) {
    if (half == 1) {
#pragma unroll
      for (int r = 0; r < R; ++r) smem.q[r][d] = o[r];  // (q is no longer read)
    }
    __syncthreads();
    if (half == 1) return;
#pragma unroll
    for (int r = 0; r < R; ++r) o[r] += smem.q[r][d];
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r < rows) w.part_out[(part + r) * D + d] = o[r];
  }
#endif
}

// The chunks' partial results of one query row of one (batch, kv head), combined: out = sum_c
// o_c 2^(m_c - M) / sum_c l_c 2^(m_c - M), M the largest m_c (first, by the whole CTA). Then
// thread t takes column t % D over every kCombineGroups-th chunk, its loads independent of
// each other, and the groups' sums are added in shared memory. A row every key of which is
// masked gets zeros (M = -inf: every factor 0), a row that met a NaN score NaN (its sums).
constexpr int kCombineThreads = 512;

template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads) attention_decode_combine_kernel(const AttentionParams p,
                                                                                  const AttentionWorkspace w) {
  constexpr int kGroups = kCombineThreads / D;
  __shared__ float warp_max[kCombineThreads / 32], group_sum[kGroups], group_out[kGroups][D];
  const int r = blockIdx.x, hk = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int d = threadIdx.x % D, g = threadIdx.x / D;
  const int64_t base = (b * p.heads_kv + hk) * w.decode_chunks * kMaxRows + r;
  const int64_t chunks = w.decode_chunks;

  float top = -INFINITY;
  for (int64_t c = threadIdx.x; c < chunks; c += kCombineThreads) top = fmaxf(top, w.part_max[base + c * kMaxRows]);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = top;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kCombineThreads / 32; ++i) top = fmaxf(top, warp_max[i]);

  float sum = 0.0f, out = 0.0f;
#pragma unroll 4
  for (int64_t c = g; c < chunks; c += kGroups) {
    const int64_t at = base + c * kMaxRows;
    const float m = w.part_max[at];
    const float scale = m == -INFINITY ? 0.0f : exp2f(m - top);
    sum = fmaf(w.part_sum[at], scale, sum);  // (a NaN sum stays NaN, even times 0)
    out = fmaf(w.part_out[at * D + d], scale, out);
  }
  if (d == 0) group_sum[g] = sum;
  group_out[g][d] = out;
  __syncthreads();
  if (g != 0) return;
  sum = 0.0f;
  out = 0.0f;
#pragma unroll
  for (int x = 0; x < kGroups; ++x) {
    sum += group_sum[x];
    out += group_out[x][d];
  }
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const Row at = row_of(r, group, hk);
  const float value = sum == 0.0f ? 0.0f : out / sum;  // NaN sums propagate
  static_cast<T*>(p.out)[b * p.out_strides.batch + at.head * p.out_strides.head + at.token * p.out_strides.seq + d] =
      core::from_float<T>(value);
}

template <typename T, int D, int R>
cudaError_t launch_rows(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(w.decode_chunks), static_cast<unsigned>(p.heads_kv),
                  static_cast<unsigned>(p.batch));
  attention_decode_kernel<T, D, R><<<grid, kThreads, 0, stream>>>(p, w);
  const unsigned rows = static_cast<unsigned>(p.seq_q * (p.heads_q / p.heads_kv));
  attention_decode_combine_kernel<T, D>
      <<<dim3(rows, static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch)), kCombineThreads, 0, stream>>>(
          p, w);
  return cudaGetLastError();
}

// The rows per kv head, rounded up to a bucket (4: one token of up to 4 grouped query heads, as
// Llama-3, Mistral and Qwen3-8B; 8; 16).
template <typename T, int D>
cudaError_t launch_typed(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  const int64_t rows = p.seq_q * (p.heads_q / p.heads_kv);
  if (rows <= 4) return launch_rows<T, D, 4>(p, w, stream);
  if (rows <= 8) return launch_rows<T, D, 8>(p, w, stream);
  return launch_rows<T, D, kMaxRows>(p, w, stream);
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

// Device scratch of the attention kernels, carved from one buffer. The 8-bit method: q (but
// for the Hopper kernel, which rounds it tile by tile) and k in INT8 in blocks of kQuantBlock
// rows (rows padded to whole blocks, padding zero), one fp32 scale per block, K's per-channel
// sums in fp64 over chunks of kMeanChunk keys, and K's mean (the chunks' sums added in a fixed
// order, so it is deterministic). The decode kernel's partial results.
#pragma once

#include <cstdint>

#include "ltx_kernels/attention.h"
#include "ops/host_util.h"

namespace ltx_kernels {

constexpr int64_t kMeanChunk = 512;

constexpr int64_t kShortMaxKeys = 128;  // keys the short-key kernel holds (attention_short.cu)

// Whether p runs on the short-key kernel (any GPU): exact precision and at most kShortMaxKeys
// keys, a cross-attention against a text encoder's tokens. The kernels that walk the keys
// step by step reload them for every tile of queries and, on Hopper, run one CTA per SM whose
// load, GEMM and store chain the few steps cannot hide (H100, LTX's 8064 queries x 128 keys:
// 153 us on the Hopper kernel, 105 on cuDNN; attention_short.cu's numbers there).
inline bool uses_short_kernel(const AttentionParams& p) {
  return p.precision == AttentionPrecision::kExact && p.seq_k > 0 && p.seq_k <= kShortMaxKeys;
}

// The decode kernel (attention_decode.cu): exact attention of at most kDecodeMaxRows query rows
// per kv head (a decode step: one token per sequence, its query heads grouped on their kv head)
// against at least kDecodeMinKeys keys, split into chunks of kDecodeChunk keys that CTAs take
// in parallel, then combined. The kernels that parallelize over query rows run one CTA per
// (batch, head) there and read the cache once per query head.
constexpr int64_t kDecodeMaxRows = 16;
constexpr int64_t kDecodeMinKeys = 512;
constexpr int64_t kDecodeChunk = 64;

inline bool uses_decode_kernel(const AttentionParams& p) {
  return p.precision == AttentionPrecision::kExact && p.seq_k >= kDecodeMinKeys &&
         p.seq_q * (p.heads_q / p.heads_kv) <= kDecodeMaxRows;
}

// Whether p runs on the Hopper kernel: an sm_90 GPU and a build for sm_90a, and not the
// short-key or the decode kernel.
inline bool uses_hopper_kernel(const AttentionParams& p) {
#ifdef LTX_KERNELS_SM90A
  return p.arch / 10 == 9 && !uses_short_kernel(p) && !uses_decode_kernel(p);
#else
  return false;
#endif
}

struct AttentionWorkspace {
  int64_t q_blocks = 0;  // per (batch, head)
  int64_t k_blocks = 0;
  int64_t k_chunks = 0;
  int8_t* q8 = nullptr;  // [B, Hq, q_blocks * kQuantBlock, D]
  int8_t* k8 = nullptr;  // [B, Hkv, k_blocks * kQuantBlock, D]
  float* q_scale = nullptr;  // [B, Hq, q_blocks]
  float* k_scale = nullptr;  // [B, Hkv, k_blocks]
  double* k_sums = nullptr;  // [B, Hkv, k_chunks, D]
  float* k_mean = nullptr;   // [B, Hkv, D]
  // The decode kernel's partial results per chunk of keys, in log2 units: each row's max, sum
  // of exponentials (NaN for a row that met a NaN score) and unnormalized output.
  int64_t decode_chunks = 0;
  float* part_max = nullptr;  // [B, Hkv, decode_chunks, kDecodeMaxRows]
  float* part_sum = nullptr;  // [B, Hkv, decode_chunks, kDecodeMaxRows]
  float* part_out = nullptr;  // [B, Hkv, decode_chunks, kDecodeMaxRows, D]
  int64_t bytes = 0;
};

// The layout for p inside `base` (nullptr: sizes only).
inline AttentionWorkspace attention_workspace(const AttentionParams& p, void* base) {
  AttentionWorkspace w;
  char* at = static_cast<char*>(base);
  const auto take = [&](int64_t bytes) {
    char* ptr = at == nullptr ? nullptr : at + w.bytes;
    w.bytes += (bytes + 255) / 256 * 256;  // each part 256-byte aligned
    return ptr;
  };
  const int64_t bq = p.batch * p.heads_q, bk = p.batch * p.heads_kv;
  if (uses_decode_kernel(p)) {
    w.decode_chunks = host_util::ceil_div(p.seq_k, kDecodeChunk);
    const int64_t rows = bk * w.decode_chunks * kDecodeMaxRows;
    w.part_max = reinterpret_cast<float*>(take(rows * 4));
    w.part_sum = reinterpret_cast<float*>(take(rows * 4));
    w.part_out = reinterpret_cast<float*>(take(rows * p.head_dim * 4));
    return w;
  }
  if (p.precision != AttentionPrecision::kInt8QK) return w;
  // (the Hopper kernel quantizes each tile's q in shared memory: no q blocks here)
  w.q_blocks = uses_hopper_kernel(p) ? 0 : host_util::ceil_div(p.seq_q, kQuantBlock);
  w.k_blocks = host_util::ceil_div(p.seq_k, kQuantBlock);
  w.k_chunks = host_util::ceil_div(p.seq_k, kMeanChunk);
  w.q8 = reinterpret_cast<int8_t*>(take(bq * w.q_blocks * kQuantBlock * p.head_dim));
  w.k8 = reinterpret_cast<int8_t*>(take(bk * w.k_blocks * kQuantBlock * p.head_dim));
  w.q_scale = reinterpret_cast<float*>(take(bq * w.q_blocks * 4));
  w.k_scale = reinterpret_cast<float*>(take(bk * w.k_blocks * 4));
  w.k_sums = reinterpret_cast<double*>(take(bk * w.k_chunks * p.head_dim * 8));
  w.k_mean = reinterpret_cast<float*>(take(bk * p.head_dim * 4));
  return w;
}

}  // namespace ltx_kernels

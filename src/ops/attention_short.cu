// The short-key attention kernel (exact precision, at most kShortMaxKeys keys: a DiT's
// cross-attention against its text tokens), on any GPU the CUDA attention takes (mma.sync).
//
// The kernels that walk the keys step by step read a (batch, head)'s K and V again for every
// tile of queries, and the Hopper one runs one CTA per SM, whose load -> GEMM -> softmax ->
// GEMM -> store chain two or three steps cannot hide. Here a CTA is persistent over a
// contiguous range of (batch, head, query tile) items, so it loads a (batch, kv head)'s keys
// and values into shared memory once for all its tiles of that head; each warp owns 16 query
// rows of a tile, prefetches its next tile's rows (cp.async, double-buffered per warp, so the
// warps need no common barrier between tiles), takes the softmax over every key at once (no
// running max, no rescaling), and writes its output rows through shared memory as whole
// 16-byte chunks. Several CTAs share an SM, so one's loads overlap another's math.
//
// Numerics as the other kernels: scores in log2 units (the scale times log2(e) folded in), the
// mask added in them, P rounded to the input dtype for the PV product, fp32 accumulation, row
// sums of the unrounded P; keys past seq_k score -inf, a row with every key masked gets zeros.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "core/activation.cuh"
#include "core/mma.cuh"
#include "core/smem_tile.cuh"
#include "ops/attention_mma.cuh"
#include "ops/attention_short_softmax.cuh"
#include "ops/attention_short.h"
#include "ops/attention_workspace.h"
#include "ops/host_util.h"
#include "ops/persistent_grid.h"

namespace ltx_kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerWarp = 16;  // mma's M
constexpr int kBlockM = kRowsPerWarp * kWarps;
constexpr int kKeys = static_cast<int>(kShortMaxKeys);
using attention_short::kLog2e;

template <int D>
struct Layout {
  using KVTile = core::SmemTile<kKeys, D * 2>;        // K and V, rows = keys
  using QTile = core::SmemTile<kRowsPerWarp, D * 2>;  // one warp's query rows (then its output rows)
  static constexpr int kQ = 2 * KVTile::kBytes;       // offset of the Q tiles: [2 buffers][kWarps]
  static constexpr int kBias = kQ + 2 * kWarps * QTile::kBytes;  // the key bias row: kKeys floats
  static constexpr int kBytes = 1024 /* base alignment */ + kBias + kKeys * 4;
};

// Rows [row0, row0 + 16) of a matrix of `rows` rows, `stride` bytes apart, into one warp's
// tile (rows past the end: zeros), by the warp's 32 lanes.
template <class TILE>
__device__ __forceinline__ void load_warp_rows(uint32_t tile, const char* base, int64_t stride, int row0, int rows,
                                               int lane) {
  constexpr int kRowStep = 32 / TILE::kChunks;
  const int c = lane % TILE::kChunks;
#pragma unroll
  for (int r = lane / TILE::kChunks; r < TILE::kRows; r += kRowStep) {
    const bool valid = row0 + r < rows;
    core::cp_async_16(tile + TILE::offset(r, c), valid ? base + static_cast<int64_t>(row0 + r) * stride + c * 16 : base,
                      valid);
  }
}

template <typename T, int D>
// Registers for four CTAs an SM at head_dim 64 (128 a thread, no spills), two at 128.
__global__ void __launch_bounds__(kThreads, D == 64 ? 4 : 2) attention_short_kernel(const AttentionParams p) {
#ifdef LTX_KERNELS_SM80_CODE
  using L = Layout<D>;
  using KVTile = typename L::KVTile;
  using QTile = typename L::QTile;
  constexpr int kQKSteps = D / 16;  // mma k-steps over head_dim
  constexpr int kNTiles = kKeys / 8;
  constexpr int kDTiles = D / 8;
  extern __shared__ char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t s_base = core::smem_addr(smem);
  const uint32_t s_k = s_base, s_v = s_base + KVTile::kBytes;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tig = lane % 4;  // the fragment's row group and thread in group
  const int seq_q = static_cast<int>(p.seq_q), seq_k = static_cast<int>(p.seq_k);
  const int64_t tiles = (p.seq_q + kBlockM - 1) / kBlockM;
  const int64_t items = p.batch * p.heads_q * tiles;
  const int64_t begin = items * blockIdx.x / gridDim.x, end = items * (blockIdx.x + 1) / gridDim.x;
  const int64_t q_stride = p.q_strides.seq * sizeof(T), kv_stride[2] = {p.k_strides.seq * static_cast<int64_t>(sizeof(T)),
                                                                       p.v_strides.seq * static_cast<int64_t>(sizeof(T))};
  const float factor = p.scale * kLog2e;

  // Item i: batch b, query head h (kv head hk), query tile t (the tiles of one head are
  // consecutive items), walked by counters: divisions (64-bit ones are emulated) once per CTA
  // and once per head, not per item.
  const int heads = static_cast<int>(p.heads_q), group = static_cast<int>(p.heads_q / p.heads_kv);
  struct Item {
    int64_t b, t;
    int h, hk;
    __device__ void advance(int64_t tiles, int heads, int group) {
      if (++t < tiles) return;
      t = 0;
      if (++h == heads) h = 0, ++b;
      hk = h / group;
    }
  };
  Item it;
  it.t = begin % tiles;
  it.h = static_cast<int>(begin / tiles % heads);
  it.b = begin / tiles / heads;
  it.hk = it.h / group;
  const auto kv_of = [&](const Item& x) { return x.b * p.heads_kv + x.hk; };
  const auto first_row = [&](const Item& x) { return static_cast<int>(x.t) * kBlockM + warp * kRowsPerWarp; };
  const auto q_rows = [&](const Item& x) {
    return static_cast<const char*>(p.q) + (x.b * p.q_strides.batch + x.h * p.q_strides.head) * sizeof(T);
  };
  const auto q_tile = [&](int buf) { return L::kQ + (buf * kWarps + warp) * QTile::kBytes; };  // byte offset

  // A mask that is one row per (batch, head), broadcast over the queries (a key padding mask,
  // LTX's), or none: one bias per key in shared memory, -inf past seq_k, so that each score
  // takes one FMA. Masks with rows of their own are read per score from global memory.
  const bool row_masks = p.mask != nullptr && p.mask_strides.seq != 0;
  float* bias = reinterpret_cast<float*>(smem + L::kBias);
  int64_t kv_loaded = -1, h_loaded = -1;
  int buf = 0;
  for (int64_t i = begin; i < end; ++i, it.advance(tiles, heads, group)) {
    const int64_t kv = kv_of(it);
    const int m0 = first_row(it);  // this warp's first query row
    // (a key mask's bias depends on the query head too: a new one whenever the head moves)
    const bool fresh = kv != kv_loaded || (!row_masks && p.mask != nullptr && p.mask_strides.head != 0 && h_loaded != it.h);
    if (fresh) {  // (uniform across the CTA)
      __syncthreads();  // every warp is done with the previous head's K and V
      const int64_t hk = it.hk;
      KVTile::template load<kThreads>(s_k, static_cast<const char*>(p.k) + (it.b * p.k_strides.batch + hk * p.k_strides.head) * sizeof(T),
                                      kv_stride[0], 0, seq_k);
      KVTile::template load<kThreads>(s_v, static_cast<const char*>(p.v) + (it.b * p.v_strides.batch + hk * p.v_strides.head) * sizeof(T),
                                      kv_stride[1], 0, seq_k);
      load_warp_rows<QTile>(s_base + q_tile(buf), q_rows(it), q_stride, m0, seq_q, lane);
      core::cp_async_commit();
      if (!row_masks) {  // this head's key bias (log2 units), read after the barrier below
        static_assert(kKeys == kThreads, "one key per thread");
        const int key = threadIdx.x;
        const float* head_mask = p.mask ? p.mask + it.b * p.mask_strides.batch + it.h * p.mask_strides.head : nullptr;
        bias[key] = key >= seq_k ? -INFINITY : head_mask != nullptr ? head_mask[key] * kLog2e : 0.0f;
      }
      kv_loaded = kv;
      h_loaded = it.h;
    }
    // The next item's rows, while this one computes, when it reads the same keys.
    if (i + 1 < end) {
      Item next = it;
      next.advance(tiles, heads, group);
      if (kv_of(next) == kv && (row_masks || p.mask == nullptr || p.mask_strides.head == 0 || next.h == it.h)) load_warp_rows<QTile>(s_base + q_tile(buf ^ 1), q_rows(next), q_stride, first_row(next), seq_q, lane);
    }
    core::cp_async_commit();
    core::cp_async_wait<1>();  // everything but the prefetch has landed
    if (fresh) {
      __syncthreads();  // K and V, loaded by every thread
    } else {
      __syncwarp();  // this warp's rows, loaded by its lanes
    }

    const uint32_t s_q = s_base + q_tile(buf);
    uint32_t qf[kQKSteps][4];  // the warp's 16 query rows, as mma A fragments
#pragma unroll
    for (int s = 0; s < kQKSteps; ++s) core::ldmatrix_x4(qf[s], s_q + QTile::offset(lane % 16, 2 * s + lane / 16));

    float acc[kNTiles][4] = {};
#pragma unroll
    for (int j = 0; j < kNTiles; j += 2) {
      if (j * 8 >= seq_k) break;  // (keys past seq_k score -inf below)
#pragma unroll
      for (int s = 0; s < kQKSteps; ++s) {
        uint32_t kb[4];  // B fragments of key tiles j and j + 1
        const int mi = lane / 8;
        core::ldmatrix_x4(kb, s_k + KVTile::offset((j + mi / 2) * 8 + lane % 8, 2 * s + mi % 2));
        core::mma_16816<T>(acc[j], qf[s], kb[0], kb[1]);
        core::mma_16816<T>(acc[j + 1], qf[s], kb[2], kb[3]);
      }
    }

    // Scores in log2 units, masked, then the softmax over all keys at once.
    float part_sum[2][2] = {};
    attention_short::softmax<kNTiles>([&](int j, int e) -> float& { return acc[j][e]; }, factor, p, it.b, it.h,
                                      m0 + g, seq_q, row_masks, bias, seq_k, tig, part_sum);

    // o = P V, 16 keys at a time.
    float o[kDTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      if (kk * 16 >= seq_k) break;  // (P is 0 there)
      attention_mma::pv_step<T, KVTile>(o, acc[2 * kk], acc[2 * kk + 1], s_v, kk * 16, lane);
    }

    // The output rows, normalized, into the warp's Q tile (its rows are in registers now),
    // then out to global memory 16 bytes at a time. (__syncwarp: every lane's ldmatrix of the
    // tile is ordered before any lane overwrites it; racecheck reports the hazard without it.)
    __syncwarp();
    char* staged = smem + q_tile(buf);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float total = part_sum[r][0] + part_sum[r][1];
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      const float inv = 1.0f / total;  // NaN scores propagate; a fully masked row (total 0) gets 0
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        const float x0 = total == 0.0f ? 0.0f : o[t][2 * r] * inv;
        const float x1 = total == 0.0f ? 0.0f : o[t][2 * r + 1] * inv;
        *reinterpret_cast<uint32_t*>(staged + QTile::offset(g + 8 * r, t) + 4 * tig) = core::pack2<T>(x0, x1);
      }
    }
    __syncwarp();
    T* out = static_cast<T*>(p.out) + it.b * p.out_strides.batch + it.h * p.out_strides.head;
    constexpr int kRowStep = 32 / QTile::kChunks;
    const int c = lane % QTile::kChunks;
#pragma unroll
    for (int r = lane / QTile::kChunks; r < kRowsPerWarp; r += kRowStep) {
      if (m0 + r < seq_q) {
        *reinterpret_cast<uint4*>(out + static_cast<int64_t>(m0 + r) * p.out_strides.seq + 8 * c) =
            *reinterpret_cast<const uint4*>(staged + QTile::offset(r, c));
      }
    }
    __syncwarp();  // the lanes are done with this buffer before a later prefetch refills it
    buf ^= 1;
  }
  core::cp_async_wait<0>();  // (no copy outlives the CTA)
#endif
}

template <typename T, int D>
cudaError_t launch_typed(const AttentionParams& p, cudaStream_t stream) {
  constexpr int kSmem = Layout<D>::kBytes;
  int grid = 0;
  if (const cudaError_t error = persistent_grid<attention_short_kernel<T, D>>(kThreads, kSmem, &grid);
      error != cudaSuccess) {
    return error;
  }
  const int64_t items = p.batch * p.heads_q * host_util::ceil_div(p.seq_q, kBlockM);
  const unsigned blocks = static_cast<unsigned>(items < grid ? items : grid);
  attention_short_kernel<T, D><<<blocks, kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_short(const AttentionParams& p, cudaStream_t stream) {
  if (!uses_short_kernel(p)) return cudaErrorInvalidValue;
  if (p.dtype == DType::kBFloat16) {
    return p.head_dim == 64 ? launch_typed<__nv_bfloat16, 64>(p, stream) : launch_typed<__nv_bfloat16, 128>(p, stream);
  }
  return p.head_dim == 64 ? launch_typed<__half, 64>(p, stream) : launch_typed<__half, 128>(p, stream);
}

}  // namespace ltx_kernels

// The Hopper attention kernel (sm_90a): FlashAttention-3's warp-specialized layout, CuTe's
// MMA atoms and descriptors, TMA loads.
//
// Persistent: one CTA per SM walks tiles of kBlockM query rows of one (batch, head), with
// 1 + kConsumers warpgroups: warpgroup 0 is the producer (one thread issues every TMA load;
// the group gives its registers to the others with setmaxnreg), the consumer warpgroups each
// own 64 rows (wgmma's M) and walk the keys BLOCK_N at a time (TileShape; two or three
// consumers, picked per call by launch_shape). A tile's Q is loaded once, into a buffer with
// a "full" and an "empty" mbarrier, so that the next tile's Q (and its first K and V) load
// while the consumers finish this one: the epilogue and the next tile's start overlap; K and
// V tiles go through a kStages-deep ring of shared-memory stages, continued across tiles,
// each with a "full" mbarrier (the producer's TMA bytes landed) and an "empty" one (every
// consumer warp is done with it). S = Q K^T reads Q and K from shared
// memory (bf16/fp16 k16, or INT8 k32 with exact int32 sums for the 8-bit method, whose K comes
// quantized from its pass over k, and whose Q each consumer rounds in place at the start of
// its tile: quantize_q); the online
// softmax runs on the accumulators in registers, in place (the scale, and for INT8 scores the
// k scale of each 64-key block, folded into the exponent's FMA; the running max moved only
// when a score exceeds it by a factor over 2^8, so that O is rarely rescaled); P, rounded to
// the input dtype, stays in registers as the A operand of O += P V (m64nDk16; m64n(D+8)k16
// where shared memory has room for a column block of ones after V, so that the same GEMM sums
// P's rows: see Layout), whose B operand is V as the user's tensor holds it, [keys, D], read
// MN-major by the wgmma (no transposing pass). TMA writes each tile
// in the 64/128-byte swizzle that the wgmma descriptors read (core/smem_tile.cuh's layout);
// rows past a tensor's end arrive as zeros; the wgmma descriptors are built once and stepped
// by constant offsets. Inside a consumer warpgroup, the softmax of one step overlaps the
// previous step's P V (see the main loop). Measured and not kept (benchmarks/results/h100/
// attention_tiles.md): a scheduler barrier making the consumer warpgroups issue their GEMMs in
// turn (no gain), FlashAttention-4's exp2 polynomial on the FMA units for 2 or 3 of every 8
// scores (slower), bf16 P rounded on the integer ALU instead of F2FP (slower: the softmax is
// issue-bound), u8 P x s8 V (twice: the int32-to-fp32 work per step costs more than the
// narrower GEMM saves, attention_fa3_fp8_design.md). Not done: FP8 P V (emulated, its error
// on randn inputs reaches the 4e-2 bar at 4000 keys).
// (the wgmma atoms whose N is not a multiple of 16, for O += P V with the row-sum columns)
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <type_traits>
#include <utility>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cuda_host_adapter.hpp>

#include "core/activation.cuh"
#include "core/convert.cuh"
#include "core/mma.cuh"
#include "core/smem_tile.cuh"
#include "ops/attention_int8.cuh"
#include "ops/attention_short_softmax.cuh"
#include "ops/attention_sm90.h"
#include "ops/host_util.h"
#include "ops/persistent_grid.h"

namespace ltx_kernels {
namespace {

namespace gmma = cute::SM90::GMMA;

constexpr int kRowsPerConsumer = 64;  // wgmma's M
constexpr int kStages = 3;  // K and V of a step are released one step late (overlap)
using core::kLog2e;
constexpr float kMaxSlack = 8.0f;  // see the softmax: exponentials up to 2^8
static_assert(kRowsPerConsumer == kQuantBlock, "one q scale per consumer warpgroup");

// The tile of one kernel: CONSUMERS warpgroups of 64 query rows each (plus the producer's),
// BLOCK_N keys per step. One CTA per SM: setmaxnreg moves the producer's registers to the
// consumers (65536 per SM: 24 + 2 x 240 or 32 + 3 x 160 per thread), whose S, P and O tiles
// must fit in them.
template <int CONSUMERS, int BLOCK_N>
struct TileShape {
  static constexpr int kConsumers = CONSUMERS, kBlockN = BLOCK_N;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBlockM = kRowsPerConsumer * kConsumers;
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups");
  static_assert(kBlockN % kQuantBlock == 0, "whole 64-key blocks (the 8-bit method's k scales) per step");
};

// The shared memory of one kernel: 1024-byte aligned tiles (the swizzle's phase; TMA's
// 128-byte swizzle requires it), then the barriers: kConsumers Q tiles, kStages x (K tile,
// V tile, ones), q_full, full[kStages], empty[kStages].
// The V tile (the B operand of O += P V: kBlockN rows of keys, D columns in 64-column blocks
// of 128 bytes, read MN-major) is followed by one more column block of ones where shared
// memory has room for it (not at head_dim 128 in 16 bits), which the kernel writes once: the
// wgmma's N then takes 8 more columns (D + kSumCols), so that the same GEMM sums each row of P
// into output columns D .. D + 7, the softmax's row sums on the tensor cores instead of one
// FADD per score in two dependent chains per thread (11% of the kernel's stall samples at
// LTX-2B 161f per ncu). They sum P as rounded for the tensor cores, the very weights that O
// sums. (The block is whole, although 8 of its 64 columns are read: all ones, the swizzle
// then does not matter, and the descriptor's one column-block stride reaches it.)
// A consumer's Q buffer holds its 64 rows of q as loaded (16-bit, Q16Tile); the 8-bit method
// rounds them to INT8 in place, the QTile layout over the buffer's first half, which Q K^T
// reads (see quantize_q), with the amax partials of its four warps after the barriers.
template <int D, bool INT8, class SHAPE>
struct Layout {
  static constexpr int kQKRow = D * (INT8 ? 1 : 2);
  using QTile = core::SmemTile<kRowsPerConsumer, kQKRow>;
  using Q16Tile = core::SmemTile<kRowsPerConsumer, D * 2>;
  using KTile = core::SmemTile<SHAPE::kBlockN, kQKRow>;
  using VTile = core::SmemTile<SHAPE::kBlockN, D * 2>;
  static constexpr int kOnesBytes = SHAPE::kBlockN * VTile::kWidth;  // one column block
  static constexpr int bytes(int ones) {
    return 1024 /* base alignment */ + SHAPE::kConsumers * Q16Tile::kBytes +
           kStages * (KTile::kBytes + VTile::kBytes + ones) + 8 * (2 + 2 * kStages) +
           (INT8 ? 16 * SHAPE::kConsumers : 0);
  }
  static constexpr int kMaxSmem = 227 * 1024;  // sm_90's dynamic shared memory per block
  static constexpr int kSumCols = bytes(kOnesBytes) <= kMaxSmem ? 8 : 0;  // 8: wgmma's N granularity
  static constexpr int kStageBytes = KTile::kBytes + VTile::kBytes + (kSumCols > 0 ? kOnesBytes : 0);
  static constexpr int kLoadBytes = KTile::kBytes + VTile::kBytes;  // a stage's TMA bytes (no ones)
  static constexpr int kSmem = bytes(kStageBytes - kLoadBytes);
  static_assert(kSmem <= kMaxSmem);
};

// An INT8 score (an int32 of magnitude < 2^22: a sum of at most 128 products of int8, < 2^21)
// as fp32, exactly, on the ALU instead of the conversion unit (which the exponentials already
// load): 2^23 + 2^22 + x has x in its low mantissa bits. A 16-bit path's score is fp32 already.
constexpr int kMagic = 0x4B400000;     // the bits of 2^23 + 2^22
constexpr float kMagicValue = 12582912.0f;
__device__ __forceinline__ float to_float(uint32_t x) {
  return __int_as_float(static_cast<int>(x) + kMagic) - kMagicValue;
}
__device__ __forceinline__ float to_float(float x) { return x; }

// The softmax overwrites each score with its exponential, in place (one register tile, not
// two): an INT8 path's int32 accumulators then hold fp32 bits.
__device__ __forceinline__ void put(float& slot, float x) { slot = x; }
__device__ __forceinline__ void put(uint32_t& slot, float x) { slot = __float_as_uint(x); }
__device__ __forceinline__ float got(float x) { return x; }
__device__ __forceinline__ float got(uint32_t x) { return __uint_as_float(x); }

using core::fast_exp2;

// The wgmma descriptor of an operand held in TILE, as its two 32-bit words: the high one (the
// 8-row core-matrix groups 8 * W bytes apart, the swizzle) is the same for every tile of the
// type; the low one holds the start address in 16-byte units (bits 0-13: any shared address
// fits, so adding an offset never carries out) and LBO. K-major (rows = M or N, the reduction
// along a row): LBO is unused by swizzled layouts. MN-major (MN, rows = K: the reduction runs
// down the rows, M or N along them): LBO is the stride between the tile's 64-element column
// blocks. Built once per tile, so that the main loop only adds compile-time offsets
// (recomputing the bit fields cost ~10 instructions per wgmma). `tile16` is the tile's shared
// address in 16-byte units, added to the constant fields rather than masked into them, so
// that tiles at constant offsets from one base are that base's register plus a constant (in
// the 8-bit head_dim 64 kernel, separate registers for each tile's descriptor spilled).
template <class TILE, bool MN = false>
struct Desc {
  uint32_t lo, hi;
  __device__ __forceinline__ static Desc of(uint32_t tile16) {
    cute::GmmaDescriptor d;
    d.desc_ = 0;
    d.bitfield.leading_byte_offset_ = MN ? static_cast<uint16_t>((TILE::kRows * TILE::kWidth) >> 4) : 1;
    d.bitfield.stride_byte_offset_ = static_cast<uint16_t>((8 * TILE::kWidth) >> 4);
    d.bitfield.base_offset_ = 0;
    d.bitfield.layout_type_ = static_cast<uint8_t>(TILE::kWidth == 128 ? gmma::LayoutType::B128 : gmma::LayoutType::B64);
    return {d.reg32_[0] + tile16, d.reg32_[1]};
  }
  // The tile `bytes` further on in shared memory (a multiple of 16).
  __device__ __forceinline__ Desc plus(uint32_t bytes) const { return {lo + (bytes >> 4), hi}; }
  // K-major: the operand starting `k_byte` bytes into the rows: the column block holding that
  // byte, then the offset inside it.
  __device__ __forceinline__ uint64_t at(int k_byte) const {
    static_assert(!MN);
    const uint32_t offset = (k_byte / TILE::kWidth) * TILE::kRows * TILE::kWidth + k_byte % TILE::kWidth;
    return static_cast<uint64_t>(hi) << 32 | (lo + (offset >> 4));
  }
  // MN-major: the operand starting at row `k_row` (a multiple of 8) of every column block.
  __device__ __forceinline__ uint64_t row(int k_row) const {
    static_assert(MN);
    return static_cast<uint64_t>(hi) << 32 | (lo + ((k_row * TILE::kWidth) >> 4));
  }
};

// The wgmma atoms, picked by CuTe's selectors for a tile shape: S = Q K^T (m64 nN, Q and K
// K-major in shared memory; INT8 k32 with int32 sums), and O += P V (m64 nD k16, P from
// registers, V in shared memory: MN-major [keys, D] as the key-walking kernel loads it, or
// K-major V^T [D, keys] as the short-key kernel transposes it; 16-bit B may be either).
template <typename T>
using CuteType = std::conditional_t<std::is_same_v<T, __half>, cutlass::half_t, cutlass::bfloat16_t>;
template <typename T, bool INT8, int N>
using QKMma = std::conditional_t<
    INT8, decltype(gmma::ss_op_selector<int8_t, int8_t, int32_t, cute::Shape<cute::_64, cute::Int<N>, cute::_32>>()),
    decltype(gmma::ss_op_selector<CuteType<T>, CuteType<T>, float, cute::Shape<cute::_64, cute::Int<N>, cute::_16>>())>;
template <typename T, int N, gmma::Major V_MAJOR>
using PVMma = decltype(gmma::rs_op_selector<CuteType<T>, CuteType<T>, float, cute::Shape<cute::_64, cute::Int<N>, cute::_16>,
                                            gmma::Major::K, V_MAJOR>());

// The atoms take each accumulator register as an argument.
template <class MMA, typename Acc, size_t... I>
__device__ __forceinline__ void mma_ss(uint64_t a, uint64_t b, Acc* d, gmma::ScaleOut scale, std::index_sequence<I...>) {
  MMA::fma(a, b, d[I]..., scale);
}
template <class MMA, size_t... I>
__device__ __forceinline__ void mma_rs(const uint32_t (&a)[4], uint64_t b, float* d, std::index_sequence<I...>) {
  MMA::fma(a[0], a[1], a[2], a[3], b, d[I]..., gmma::ScaleOut::One);
}

template <typename Acc, int N>
__device__ __forceinline__ void fence_operands(Acc (&regs)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(regs[i]);
}

// The TMA maps of one call: Q and V (the user's bf16/fp16 tensors [B, H, S, D] with their
// strides) and K (the user's, or the 8-bit method's INT8 workspace), passed by value as
// __grid_constant__.
struct TmaMaps {
  CUtensorMap q, k, v;
};

// A tile of TILE (core::SmemTile: column blocks of kWidth bytes, rows kRows) from a map whose
// dims are (columns, rows, rest...): one TMA load per column block, all completing on `bar`.
template <class TILE, typename T>
__device__ __forceinline__ void tma_tile(const CUtensorMap& map, uint64_t* bar, char* tile, int row0, int head,
                                         int batch, int col0 = 0) {
  constexpr int kBlockCols = TILE::kWidth / static_cast<int>(sizeof(T));
#pragma unroll
  for (int blk = 0; blk < TILE::kBytes / (TILE::kRows * TILE::kWidth); ++blk) {
    cute::SM90_TMA_LOAD_4D::copy(&map, bar, 0, tile + blk * TILE::kRows * TILE::kWidth, col0 + blk * kBlockCols,
                                 row0, head, batch);
  }
}

template <typename T, int D, bool INT8, class SHAPE>
__global__ void __launch_bounds__(SHAPE::kThreads, 1)
    attention_sm90_kernel(const AttentionParams p, const AttentionWorkspace w, const __grid_constant__ TmaMaps maps) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
  using QK = std::conditional_t<INT8, int8_t, T>;
  using Acc = std::conditional_t<INT8, uint32_t, float>;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kConsumers = SHAPE::kConsumers, kBlockN = SHAPE::kBlockN, kBlockM = SHAPE::kBlockM;
  constexpr int kNTiles = kBlockN / 8;  // 8-key column tiles of S
  constexpr int kKBlocks = kBlockN / kQuantBlock;  // 64-key blocks (the k scales') per step
  constexpr int kPerBlock = kQuantBlock / 2;        // a thread's scores in one such block
  using L = Layout<D, INT8, SHAPE>;
  using QTile = typename L::QTile;
  using Q16Tile = typename L::Q16Tile;
  using KTile = typename L::KTile;
  using VTile = typename L::VTile;
  constexpr int kQKSteps = L::kQKRow / 32;  // wgmma k-steps over head_dim: 32 bytes each
  constexpr int kSumCols = L::kSumCols, kStageBytes = L::kStageBytes;
  constexpr int kOCols = D + kSumCols;  // O's columns, then the row sums (if on the tensor cores)
  extern __shared__ char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  char* s_q = smem;                                  // kConsumers Q tiles
  char* s_stage = s_q + kConsumers * Q16Tile::kBytes;  // kStages x (K tile, V tile, ones)
  uint64_t* bars = reinterpret_cast<uint64_t*>(s_stage + kStages * kStageBytes);
  uint64_t* q_full = bars;
  uint64_t* q_empty = bars + 1;
  uint64_t* full = bars + 2;             // [kStages]
  uint64_t* empty = bars + 2 + kStages;  // [kStages]
  float* q_amax = reinterpret_cast<float*>(bars + 2 + 2 * kStages);  // INT8: [kConsumers][4 warps]

  // (broadcast from lane 0, so that the compiler knows it is warp-uniform and keeps what
  // derives from it, e.g. the descriptors, in uniform registers)
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const int seq_q = static_cast<int>(p.seq_q), seq_k = static_cast<int>(p.seq_k);
  const int steps = (seq_k + kBlockN - 1) / kBlockN;
  // The CTA's tiles: blockIdx.x, then every gridDim.x-th (the launcher checks the count fits
  // an int). A tile is (query block, head, batch), the query block fastest: the order of the
  // one-CTA-per-tile grid before, so that a wave of tiles (132 on an H100: ~3 heads at LTX-2B
  // 161 frames) shares its heads' K and V in L2.
  const int m_blocks = (seq_q + kBlockM - 1) / kBlockM, heads_q = static_cast<int>(p.heads_q);
  const int tiles = m_blocks * heads_q * static_cast<int>(p.batch);
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  struct TileIndex {
    int m_block, h, hk, b;  // b: also the TMA coordinate (column, row, head, batch)
  };
  const auto tile_index = [&](int tile) {
    const int bh = tile / m_blocks, h = bh % heads_q;
    return TileIndex{tile % m_blocks, h, h / group, bh / heads_q};
  };

  // The ones column block after every stage's V tile, seen by the wgmma's async proxy after
  // the barrier below.
  if constexpr (kSumCols > 0) {
    constexpr int kChunks = L::kOnesBytes / 16;
    const uint32_t one2 = core::pack2<T>(1.0f, 1.0f);
    for (int i = threadIdx.x; i < kStages * kChunks; i += SHAPE::kThreads) {
      *reinterpret_cast<uint4*>(s_stage + i / kChunks * kStageBytes + L::kLoadBytes + 16 * (i % kChunks)) =
          make_uint4(one2, one2, one2, one2);
    }
    cutlass::arch::fence_view_async_shared();
  }
  if (threadIdx.x == 0) {
    Barrier::init(q_full, 1);
    Barrier::init(q_empty, 4 * kConsumers);  // one arrival per consumer warp
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&full[s], 1);
      Barrier::init(&empty[s], 4 * kConsumers);  // one arrival per consumer warp
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: one thread issues every load; the rest of the warpgroup idles.
    cutlass::arch::warpgroup_reg_dealloc<SHAPE::kProducerRegs>();
    if (threadIdx.x != 0) return;
    // The ring position of the next load and the phase of its stage, across tiles.
    int stage = 0, phase = 0, n = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++n) {
      const TileIndex at = tile_index(tile);
      // The tile's Q, once every consumer warp has the previous tile's last S (its last read
      // of Q). A fresh barrier counts as having completed the phase before its first: the
      // first tile's wait passes, as do the first kStages waits on `empty`.
      const auto load_q = [&] {
        Barrier::wait(q_empty, (n & 1) ^ 1);
        Barrier::arrive_and_expect_tx(q_full, kConsumers * Q16Tile::kBytes);
#pragma unroll
        for (int c = 0; c < kConsumers; ++c) {
          tma_tile<Q16Tile, T>(maps.q, q_full, s_q + c * Q16Tile::kBytes, at.m_block * kBlockM + c * kRowsPerConsumer,
                              at.h, at.b);
        }
      };
      if (steps == 0) load_q();
      for (int step = 0; step < steps; ++step) {
        Barrier::wait(&empty[stage], phase ^ 1);
        Barrier::arrive_and_expect_tx(&full[stage], L::kLoadBytes);
        char* s_k = s_stage + stage * kStageBytes;
        tma_tile<KTile, QK>(maps.k, &full[stage], s_k, step * kBlockN, at.hk, at.b);
        tma_tile<VTile, T>(maps.v, &full[stage], s_k + KTile::kBytes, step * kBlockN, at.hk, at.b);
        // (the first K and V before Q, as FlashAttention-3 orders them: their stage frees up
        // while the previous tile still runs, Q only at its last step)
        if (step == 0) load_q();
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<SHAPE::kConsumerRegs>();

  // Consumer warpgroup c = wg - 1: query rows m0 .. m0 + 63 of each tile.
  const int c = wg - 1, t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const int g = lane / 4, tig = lane % 4;
  const uint32_t smem16 = core::smem_addr(smem) >> 4;  // (the tiles' descriptors: constant offsets from it)
  char* s_my_q = s_q + c * Q16Tile::kBytes;
  const Desc<QTile> q_desc = Desc<QTile>::of(smem16 + c * (Q16Tile::kBytes >> 4));
  constexpr uint32_t kStage16 = (kConsumers * Q16Tile::kBytes) >> 4;  // stage 0
  const Desc<KTile> k_desc0 = Desc<KTile>::of(smem16 + kStage16);
  const Desc<VTile, true> v_desc0 = Desc<VTile, true>::of(smem16 + kStage16 + (KTile::kBytes >> 4));
  // The tile's state, set at its start (the functions below refer to it): its batch and
  // heads, first row, score factor (INT8: with q's block scale), k scales and mask; rows g and
  // g + 8 of this warp's 16: running max (log2 units), this thread's partial row sum where the
  // tensor cores do not sum them; o[4 t + e]: output column 8 t + 2 tig + e % 2 of row g + 8
  // (e / 2), the row sums in columns D and up where they do.
  int64_t b = 0;
  int h = 0, hk = 0, m0 = 0, row_lo = 0;
  float q_factor = 0.0f;
  const float* k_scale = nullptr;
  const float* mask = nullptr;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  float o[kOCols / 2] = {};

  // One step's S = Q K^T, issued without waiting.
  auto issue_qk = [&](Acc (&s)[kBlockN / 2], int stage) {
    const Desc<KTile> k_desc = k_desc0.plus(stage * kStageBytes);
#pragma unroll
    for (int ks = 0; ks < kQKSteps; ++ks) {
      mma_ss<QKMma<T, INT8, kBlockN>>(q_desc.at(32 * ks), k_desc.at(32 * ks), s,
                                      ks == 0 ? gmma::ScaleOut::Zero : gmma::ScaleOut::One,
                                      std::make_index_sequence<kBlockN / 2>{});
    }
    cute::warpgroup_commit_batch();
  };
  // O += P V of one step, issued without waiting; P stays in registers the wgmma reads.
  auto issue_pv = [&](uint32_t (&pa)[kBlockN / 16][4], int stage) {
    const Desc<VTile, true> v_desc = v_desc0.plus(stage * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      mma_rs<PVMma<T, kOCols, gmma::Major::MN>>(pa[kk], v_desc.row(16 * kk), o, std::make_index_sequence<kOCols / 2>{});
    }
    cute::warpgroup_commit_batch();
  };
  // The factor of each 64-key block of a step (INT8: q's and that block's k scale), loaded
  // before the wait for the step's scores so that the load's latency overlaps the GEMM.
  auto step_factors = [&](int step, float (&factor)[kKBlocks]) {
#pragma unroll
    for (int kb = 0; kb < kKBlocks; ++kb) {
      factor[kb] = q_factor;
      if constexpr (INT8) {
        factor[kb] *= k_scale[min(step * kKBlocks + kb, static_cast<int>(w.k_blocks) - 1)];
      }
    }
  };
  // The online softmax of one step's scores, in place: each score becomes exp2(score - new
  // max), row_max moves on, alpha is the factor by which O (and its row sums) must shrink. It reads
  // only S, so it runs while the previous step's P V is still in flight.
  auto softmax = [&](Acc (&s)[kBlockN / 2], int step, const float (&factor)[kKBlocks], float (&alpha)[2]) {
    // Scores in log2 units, masked: element 4 i + e is row row_lo + 8 (e / 2), key
    // n0 + 8 i + 2 tig + e % 2. Only a step with a mask or the sequence's end checks keys.
    const int n0 = step * kBlockN;
    const bool edge = mask != nullptr || n0 + kBlockN > seq_k;
    bool positive = true;
#pragma unroll
    for (int kb = 0; kb < kKBlocks; ++kb) positive = positive && factor[kb] > 0.0f;  // (false for NaN)
    // A step without key checks and with positive factors scales inside the exponent (one
    // FMA per score): the row max of a block's raw scores gives its scaled one.
    const bool fused = !edge && positive;
    float step_max[2] = {row_max[0], row_max[1]};
    // The key checks sit outside the element loops: one uniform branch per step.
    if (fused) {
#pragma unroll
      for (int kb = 0; kb < kKBlocks; ++kb) {
        if constexpr (INT8) {  // integer max: no conversion per element
          int raw[2] = {INT_MIN, INT_MIN};
#pragma unroll
          for (int j = 0; j < kPerBlock; ++j) {
            raw[(j % 4) / 2] = max(raw[(j % 4) / 2], static_cast<int>(s[kb * kPerBlock + j]));
          }
          step_max[0] = fmaxf(step_max[0], static_cast<float>(raw[0]) * factor[kb]);
          step_max[1] = fmaxf(step_max[1], static_cast<float>(raw[1]) * factor[kb]);
        } else {
          float raw[2] = {-INFINITY, -INFINITY};
#pragma unroll
          for (int j = 0; j < kPerBlock; ++j) raw[(j % 4) / 2] = fmaxf(raw[(j % 4) / 2], s[kb * kPerBlock + j]);
          step_max[0] = fmaxf(step_max[0], raw[0] * factor[kb]);
          step_max[1] = fmaxf(step_max[1], raw[1] * factor[kb]);
        }
      }
    } else if (!edge) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        const float x = to_float(s[i]) * factor[8 * (i / 4) / kQuantBlock];
        put(s[i], x);
        step_max[(i % 4) / 2] = fmaxf(step_max[(i % 4) / 2], x);
      }
    } else {
      // (a loop of its own, each key check a select: inside a branch shared with the loop
      // above, ptxas gave every score its own branch, and the masked steps ran ~1.3x slower)
#pragma unroll
      for (int i = 0; i < kNTiles; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row_lo + 8 * (e / 2), key = n0 + 8 * i + 2 * tig + e % 2;
          float x = to_float(s[4 * i + e]) * factor[8 * i / kQuantBlock];
          if (mask != nullptr && row < seq_q && key < seq_k) x += mask[row * p.mask_strides.seq + key] * kLog2e;
          x = key < seq_k ? x : -INFINITY;
          put(s[4 * i + e], x);
          step_max[e / 2] = fmaxf(step_max[e / 2], x);
        }
      }
    }
    // The running max moves only when a score exceeds it by more than kMaxSlack (log2 units;
    // FlashAttention-4's lazy rescaling): the exponentials stay <= 2^kMaxSlack, which fp32
    // sums and 16-bit P hold with the same relative precision, and O is rescaled only in the
    // few steps where a row's max moves (alpha 1 elsewhere).
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      step_max[r] = fmaxf(step_max[r], __shfl_xor_sync(0xffffffffu, step_max[r], 1));
      step_max[r] = fmaxf(step_max[r], __shfl_xor_sync(0xffffffffu, step_max[r], 2));
      const bool moves = step_max[r] > row_max[r] + kMaxSlack;  // (-inf + slack is -inf)
      const float old = row_max[r];
      if (moves) row_max[r] = step_max[r];
      // A row with every key so far masked keeps -inf; exp2 of its scores must give 0, not NaN.
      base[r] = row_max[r] == -INFINITY ? 0.0f : row_max[r];
      alpha[r] = moves ? fast_exp2(old - base[r]) : 1.0f;
      if constexpr (kSumCols == 0) row_sum[r] *= alpha[r];
    }
    if (fused) {
#pragma unroll
      for (int kb = 0; kb < kKBlocks; ++kb) {
        if constexpr (INT8) {
          // x = 2^23 + 2^22 + s exactly (to_float without its subtraction), so that
          // s f - base = x f - (12582912 f + base): one integer add and one FMA per score.
          // The constant's rounding (< 1 ulp of 12582912 f) is below one unit of the score.
          const float shift[2] = {fmaf(kMagicValue, factor[kb], base[0]), fmaf(kMagicValue, factor[kb], base[1])};
#pragma unroll
          for (int j = 0; j < kPerBlock; ++j) {
            Acc& slot = s[kb * kPerBlock + j];
            const float x = __int_as_float(static_cast<int>(slot) + kMagic);
            put(slot, fast_exp2(fmaf(x, factor[kb], -shift[(j % 4) / 2])));
          }
        } else {
#pragma unroll
          for (int j = 0; j < kPerBlock; ++j) {
            Acc& slot = s[kb * kPerBlock + j];
            put(slot, fast_exp2(fmaf(slot, factor[kb], -base[(j % 4) / 2])));
          }
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) put(s[i], fast_exp2(got(s[i]) - base[(i % 4) / 2]));
    }
    if constexpr (kSumCols == 0) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) row_sum[(i % 4) / 2] += got(s[i]);
    }
  };
  // P as the A fragments of k-steps of 16 keys: the accumulator layout of two adjacent 8-key
  // tiles is the A layout of one k-step.
  auto pack_p = [&](const Acc (&p_tile)[kBlockN / 2], uint32_t (&pa)[kBlockN / 16][4]) {
#pragma unroll
    for (int i = 0; i < kNTiles; ++i) {
      pa[i / 2][2 * (i % 2)] = core::pack2<T>(got(p_tile[4 * i]), got(p_tile[4 * i + 1]));
      pa[i / 2][2 * (i % 2) + 1] = core::pack2<T>(got(p_tile[4 * i + 2]), got(p_tile[4 * i + 3]));
    }
  };
  auto fence_p = [](uint32_t (&pa)[kBlockN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) fence_operands(pa[kk]);
  };
  // This warp is done with a stage (its wgmma reads completed): one arrival.
  auto release = [&](int stage) {
    if (lane == 0) Barrier::arrive(&empty[stage]);
  };
  // The 8-bit method's q for this tile: the warpgroup's 64 rows, loaded 16-bit into its Q
  // buffer, rounded to INT8 in place (int8_block: one scale for the block, as the quantization
  // pass of the other kernels rounds it), which Q K^T then reads; returns the block's scale.
  // Rows past q's end arrived as zeros (TMA), as that pass pads them. Once per tile: the pass
  // it replaces read and wrote all of q once more (LTX-2B 161f: 35 us an attention call).
  auto quantize_q = [&]() -> float {
    constexpr int kChunks = Q16Tile::kChunks;               // 16-byte chunks a row
    constexpr int kPer = kRowsPerConsumer * kChunks / 128;  // a thread's chunks
    float v[kPer][8];
    float amax = 0.0f;
    const core::NanMax max_op;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int chunk = t + 128 * i;
      const uint4 raw = *reinterpret_cast<const uint4*>(s_my_q + Q16Tile::offset(chunk / kChunks, chunk % kChunks));
      const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v[i][e] = core::to_float(x[e]);
        amax = max_op(amax, fabsf(v[i][e]));
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) amax = max_op(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    float* partial = q_amax + 4 * c;
    if (lane == 0) partial[warp] = amax;
    cutlass::arch::NamedBarrier::sync(128, 1 + c);  // (also: every thread has read its 16-bit q)
    amax = int8_block::amax_of(max_op(max_op(partial[0], partial[1]), max_op(partial[2], partial[3])));
    const float inverse = int8_block::inverse_of(amax);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      // (16-bit chunk j of a row holds its columns 8 j .. 8 j + 7: half of INT8 chunk j / 2)
      const int chunk = t + 128 * i, j = chunk % kChunks;
      *reinterpret_cast<uint2*>(s_my_q + QTile::offset(chunk / kChunks, j / 2) + 8 * (j % 2)) =
          int8_block::pack8(v[i], inverse);
    }
    cutlass::arch::fence_view_async_shared();  // the INT8 tile, to the wgmma's async proxy
    cutlass::arch::NamedBarrier::sync(128, 1 + c);
    return int8_block::scale_of(amax);
  };
  // This warp is done with the tile's Q (its last Q K^T landed): one arrival.
  auto release_q = [&] {
    if (lane == 0) Barrier::arrive(q_empty);
  };

  // The ring position of the next step and the phase of its full barrier, across tiles, kept
  // as counters (a modulo by 3 costs a multiply-high per step).
  int stage = 0, phase = 0, n = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++n) {
    const TileIndex at = tile_index(tile);
    b = at.b, h = at.h, hk = at.hk;
    m0 = at.m_block * kBlockM + c * kRowsPerConsumer;
    row_lo = m0 + 16 * warp + g;
    q_factor = p.scale * kLog2e;
    k_scale = INT8 ? w.k_scale + (b * p.heads_kv + hk) * w.k_blocks : nullptr;
    mask = p.mask ? p.mask + b * p.mask_strides.batch + h * p.mask_strides.head : nullptr;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
#pragma unroll
    for (int i = 0; i < kOCols / 2; ++i) o[i] = 0.0f;
    Barrier::wait(q_full, n & 1);
    if constexpr (INT8) q_factor *= quantize_q();

    // Intra-warpgroup overlap (FlashAttention-3): step j's Q K_j^T and step j - 1's P V_{j-1}
    // are issued together; the softmax of step j (exponentials on the SFU) runs while the
    // tensor cores do P V_{j-1}. O is rescaled only once that P V has landed.
    // S and its exponentials live within one step (declared there, so that nothing keeps the
    // last step's values alive); P is carried to the next. Q is released after the tile's last
    // Q K^T lands, so that the next tile's Q loads under this one's last softmax and P V.
    uint32_t pa[kBlockN / 16][4];
    if (steps > 0) {  // no keys: O stays 0, the row sums 0
      Acc s[kBlockN / 2];  // no zeroing: the first k-step overwrites (ScaleOut::Zero)
      float alpha[2];
      Barrier::wait(&full[stage], phase);
      fence_operands(s);
      cute::warpgroup_arrive();
      issue_qk(s, stage);
      float factor[kKBlocks];
      step_factors(0, factor);
      cute::warpgroup_wait<0>();
      fence_operands(s);
      if (steps == 1) release_q();
      softmax(s, 0, factor, alpha);  // O is zero: no rescale
      pack_p(s, pa);
      for (int step = 1; step < steps; ++step) {
        const int prev = stage;
        if (++stage == kStages) stage = 0, phase ^= 1;
        Acc s[kBlockN / 2];
        float alpha[2];
        Barrier::wait(&full[stage], phase);
        fence_operands(s);
        fence_p(pa);
        fence_operands(o);
        cute::warpgroup_arrive();
        issue_qk(s, stage);
        issue_pv(pa, prev);
        float factor[kKBlocks];
        step_factors(step, factor);
        cute::warpgroup_wait<1>();  // S of this step (batches complete in order)
        fence_operands(s);
        if (step == steps - 1) release_q();
        softmax(s, step, factor, alpha);
        cute::warpgroup_wait<0>();  // P V of the previous step
        fence_p(pa);
        fence_operands(o);
        release(prev);
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {  // (warp-uniform)
#pragma unroll
          for (int i = 0; i < kOCols / 2; ++i) o[i] *= alpha[(i % 4) / 2];
        }
        pack_p(s, pa);
      }
      fence_p(pa);
      fence_operands(o);
      cute::warpgroup_arrive();
      issue_pv(pa, stage);
      cute::warpgroup_wait<0>();
      fence_p(pa);
      fence_operands(o);
      release(stage);
      if (++stage == kStages) stage = 0, phase ^= 1;
    } else {
      release_q();
    }

    T* out = static_cast<T*>(p.out) + b * p.out_strides.batch + h * p.out_strides.head;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float total;
      if constexpr (kSumCols > 0) {
        total = o[D / 2 + 2 * r];  // column D of row g + 8 r: its sum
      } else {
        total = row_sum[r];
        total += __shfl_xor_sync(0xffffffffu, total, 1);
        total += __shfl_xor_sync(0xffffffffu, total, 2);
      }
      const int row = row_lo + 8 * r;
      if (row >= seq_q) continue;
      const float inv = 1.0f / total;  // NaN scores propagate; a fully masked row (total 0) gets 0
#pragma unroll
      for (int tt = 0; tt < D / 8; ++tt) {
        const float x0 = total == 0.0f ? 0.0f : o[4 * tt + 2 * r] * inv;
        const float x1 = total == 0.0f ? 0.0f : o[4 * tt + 2 * r + 1] * inv;
        *reinterpret_cast<uint32_t*>(out + row * p.out_strides.seq + 8 * tt + 2 * tig) = core::pack2<T>(x0, x1);
      }
    }
  }
#endif
}

// The short-key kernel's Hopper form (attention_short.cu has the design and the numerics):
// one warpgroup per CTA, 64 query rows per item, S = Q K^T as one m64n128 wgmma per 16 of
// head_dim and O = P V as one m64nD wgmma per 16 keys, where the mma.sync kernel issues 128
// HMMA per warp and 16 rows. K is loaded as it is (K-major, the QK^T operand), V transposed
// into V^T while it is loaded (once per head: the PV operand is read K-major; the kernel above
// reads V MN-major, straight from TMA, instead), the query tile double-buffered (cp.async).
constexpr int kShortThreads = 128;

template <typename T, int D>
__global__ void __launch_bounds__(kShortThreads, D == 64 ? 3 : 1) attention_short_sm90_kernel(const AttentionParams p) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
  constexpr int kKeys = static_cast<int>(kShortMaxKeys);
  constexpr int kQKSteps = D * 2 / 32;  // wgmma k-steps over head_dim: 32 bytes each
  constexpr int kNTiles = kKeys / 8;
  using QTile = core::SmemTile<kRowsPerConsumer, D * 2>;
  using KTile = core::SmemTile<kKeys, D * 2>;
  using VTile = core::SmemTile<D, kKeys * 2>;  // V^T: D rows of kKeys keys
  extern __shared__ char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  char* s_k = smem;
  char* s_vt = s_k + KTile::kBytes;
  char* s_q = s_vt + VTile::kBytes;  // [2] query tiles
  float* bias = reinterpret_cast<float*>(s_q + 2 * QTile::kBytes);  // kKeys floats
  const uint32_t k_addr = core::smem_addr(s_k), q_addr = core::smem_addr(s_q);
  const Desc<KTile> k_desc = Desc<KTile>::of(k_addr >> 4);
  const Desc<VTile> v_desc = Desc<VTile>::of(core::smem_addr(s_vt) >> 4);

  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int g = lane / 4, tig = lane % 4;
  const int seq_q = static_cast<int>(p.seq_q), seq_k = static_cast<int>(p.seq_k);
  const int heads = static_cast<int>(p.heads_q), group = static_cast<int>(p.heads_q / p.heads_kv);
  const int64_t tiles = (p.seq_q + kRowsPerConsumer - 1) / kRowsPerConsumer;
  const int64_t items = p.batch * p.heads_q * tiles;
  const int64_t begin = items * blockIdx.x / gridDim.x, end = items * (blockIdx.x + 1) / gridDim.x;
  const float factor = p.scale * kLog2e;
  const bool row_masks = p.mask != nullptr && p.mask_strides.seq != 0;

  // Items as in attention_short.cu: (batch, head, tile), walked by counters.
  int64_t b = begin / tiles / heads, tile = begin % tiles;
  int h = static_cast<int>(begin / tiles % heads);
  const auto q_rows = [&](int64_t bb, int hh) {
    return static_cast<const char*>(p.q) + (bb * p.q_strides.batch + hh * p.q_strides.head) * sizeof(T);
  };
  const int64_t q_stride = p.q_strides.seq * static_cast<int64_t>(sizeof(T));
  int64_t kv_loaded = -1;
  int h_loaded = -1, buf = 0;
  for (int64_t i = begin; i < end; ++i) {
    const int hk = h / group;
    const int64_t kv = b * p.heads_kv + hk;
    const int m0 = static_cast<int>(tile) * kRowsPerConsumer;
    const bool fresh = kv != kv_loaded || (!row_masks && p.mask != nullptr && p.mask_strides.head != 0 && h_loaded != h);
    // The next item, for the prefetch of its query rows.
    int64_t nb = b, ntile = tile + 1;
    int nh = h;
    if (ntile == tiles) {
      ntile = 0;
      if (++nh == heads) nh = 0, ++nb;
    }
    if (fresh) {
      __syncthreads();  // every warp is done with the previous head's K, V^T and bias
      const char* k_src = static_cast<const char*>(p.k) + (b * p.k_strides.batch + hk * p.k_strides.head) * sizeof(T);
      KTile::template load<kShortThreads>(k_addr, k_src, p.k_strides.seq * static_cast<int64_t>(sizeof(T)), 0, seq_k);
      QTile::template load<kShortThreads>(q_addr + buf * QTile::kBytes, q_rows(b, h), q_stride, m0, seq_q);
      core::cp_async_commit();
      // V^T, element by element from 16-byte rows of V (keys past seq_k: zeros, as P is 0 there
      // and 0 * garbage could be NaN).
      const T* v_src = static_cast<const T*>(p.v) + b * p.v_strides.batch + hk * p.v_strides.head;
      for (int idx = t; idx < kKeys * (D / 8); idx += kShortThreads) {
        const int key = idx / (D / 8), c = idx % (D / 8);
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (key < seq_k) raw = *reinterpret_cast<const uint4*>(v_src + key * p.v_strides.seq + 8 * c);
        const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          *reinterpret_cast<T*>(s_vt + VTile::offset(8 * c + e, key / 8) + (key % 8) * 2) = x[e];
        }
      }
      if (!row_masks) {  // one bias per key (log2 units), -inf past seq_k
        static_assert(kKeys == kShortThreads, "one key per thread");
        const float* head_mask = p.mask ? p.mask + b * p.mask_strides.batch + h * p.mask_strides.head : nullptr;
        bias[t] = t >= seq_k ? -INFINITY : head_mask != nullptr ? head_mask[t] * kLog2e : 0.0f;
      }
      kv_loaded = kv;
      h_loaded = h;
    }
    const bool prefetch = i + 1 < end && nb * p.heads_kv + nh / group == kv &&
                          (row_masks || p.mask == nullptr || p.mask_strides.head == 0 || nh == h);
    if (prefetch) {
      QTile::template load<kShortThreads>(q_addr + (buf ^ 1) * QTile::kBytes, q_rows(nb, nh), q_stride,
                                          static_cast<int>(ntile) * kRowsPerConsumer, seq_q);
    }
    core::cp_async_commit();
    core::cp_async_wait<1>();  // everything but the prefetch has landed
    // (the generic-proxy stores of V^T and the async copies, seen by the wgmma's async proxy)
    cutlass::arch::fence_view_async_shared();
    __syncthreads();

    // S = Q K^T: 64 rows x kKeys keys, element 4 j + e of a thread is row 16 warp + g + 8 (e / 2),
    // key 8 j + 2 tig + e % 2 (the mma.sync kernels' layout, per warp).
    float s[kKeys / 2];
    const Desc<QTile> q_desc = Desc<QTile>::of((q_addr + buf * QTile::kBytes) >> 4);
    fence_operands(s);
    cute::warpgroup_arrive();
#pragma unroll
    for (int ks = 0; ks < kQKSteps; ++ks) {
      mma_ss<QKMma<T, false, kKeys>>(q_desc.at(32 * ks), k_desc.at(32 * ks), s,
                                     ks == 0 ? gmma::ScaleOut::Zero : gmma::ScaleOut::One,
                                     std::make_index_sequence<kKeys / 2>{});
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_operands(s);

    float part_sum[2][2] = {};
    attention_short::softmax<kNTiles>([&](int j, int e) -> float& { return s[4 * j + e]; }, factor, p, b, h,
                                      m0 + 16 * warp + g, seq_q, row_masks, bias, seq_k, tig, part_sum);
    uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      pa[j / 2][2 * (j % 2)] = core::pack2<T>(s[4 * j], s[4 * j + 1]);
      pa[j / 2][2 * (j % 2) + 1] = core::pack2<T>(s[4 * j + 2], s[4 * j + 3]);
    }

    // O = P V: P from registers, V^T from shared memory.
    float o[D / 2] = {};
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    fence_operands(o);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      mma_rs<PVMma<T, D, gmma::Major::K>>(pa[kk], v_desc.at(32 * kk), o, std::make_index_sequence<D / 2>{});
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_operands(o);

    // The rows, normalized, staged in this item's query tile (its wgmma reads are done), then
    // out 16 bytes at a time; each warp its own 16 rows.
    char* staged = s_q + buf * QTile::kBytes;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float total = part_sum[r][0] + part_sum[r][1];
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      const float inv = 1.0f / total;  // NaN scores propagate; a fully masked row (total 0) gets 0
#pragma unroll
      for (int tt = 0; tt < D / 8; ++tt) {
        const float x0 = total == 0.0f ? 0.0f : o[4 * tt + 2 * r] * inv;
        const float x1 = total == 0.0f ? 0.0f : o[4 * tt + 2 * r + 1] * inv;
        *reinterpret_cast<uint32_t*>(staged + QTile::offset(16 * warp + g + 8 * r, tt) + 4 * tig) =
            core::pack2<T>(x0, x1);
      }
    }
    __syncwarp();
    T* out = static_cast<T*>(p.out) + b * p.out_strides.batch + h * p.out_strides.head;
    constexpr int kChunks = QTile::kChunks, kRowStep = 32 / kChunks;
#pragma unroll
    for (int r = lane / kChunks; r < 16; r += kRowStep) {
      const int row = 16 * warp + r;
      if (m0 + row < seq_q) {
        *reinterpret_cast<uint4*>(out + static_cast<int64_t>(m0 + row) * p.out_strides.seq + 8 * (lane % kChunks)) =
            *reinterpret_cast<const uint4*>(staged + QTile::offset(row, lane % kChunks));
      }
    }
    __syncthreads();  // the staged rows are out before a later prefetch refills this tile
    buf ^= 1;
    b = nb, h = nh, tile = ntile;
  }
  core::cp_async_wait<0>();
#endif
}

// The TMA map of a [batch, heads, rows, cols] tensor (strides in elements, cols contiguous),
// loaded as boxes of `box_rows` rows by one swizzle width (`width` bytes) of columns. A stride
// of 0 (a dim of size 1, never stepped along) is replaced by a valid one.
cudaError_t tma_map(CUtensorMap* map, const void* base, int elem_bytes, int64_t cols, int64_t rows, int64_t heads,
                    int64_t batch, Strides4 strides, int box_rows, int width) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  int64_t row = strides.seq ? strides.seq : cols;
  int64_t head = strides.head ? strides.head : row * rows;
  int64_t bat = strides.batch ? strides.batch : head * heads;
  const cuuint64_t bytes[3] = {static_cast<cuuint64_t>(row * elem_bytes), static_cast<cuuint64_t>(head * elem_bytes),
                               static_cast<cuuint64_t>(bat * elem_bytes)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(width / elem_bytes), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUresult r = cutlass::call_cuTensorMapEncodeTiled(
      map, elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 4,
      const_cast<void*>(base), dims, bytes, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
      width == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // rows past the end: zeros
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, int D, bool INT8, class SHAPE>
cudaError_t launch_kernel(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  using L = Layout<D, INT8, SHAPE>;
  using Q16Tile = typename L::Q16Tile;
  using KTile = typename L::KTile;
  using VTile = typename L::VTile;
  constexpr int kBlockN = SHAPE::kBlockN, kSmem = L::kSmem;
  TmaMaps maps{};
  cudaError_t error;
  // q as the user holds it, 16-bit (the 8-bit method rounds it in the kernel).
  error = tma_map(&maps.q, p.q, 2, D, p.seq_q, p.heads_q, p.batch, p.q_strides, kRowsPerConsumer, Q16Tile::kWidth);
  if (error == cudaSuccess && p.seq_k > 0) {  // no keys: no K or V load, their maps unused
    if constexpr (INT8) {
      const Strides4 k{p.heads_kv * w.k_blocks * kQuantBlock * D, w.k_blocks * kQuantBlock * D, D};
      error = tma_map(&maps.k, w.k8, 1, D, w.k_blocks * kQuantBlock, p.heads_kv, p.batch, k, kBlockN, KTile::kWidth);
    } else {
      error = tma_map(&maps.k, p.k, 2, D, p.seq_k, p.heads_kv, p.batch, p.k_strides, kBlockN, KTile::kWidth);
    }
    if (error == cudaSuccess) {
      error = tma_map(&maps.v, p.v, 2, D, p.seq_k, p.heads_kv, p.batch, p.v_strides, kBlockN, VTile::kWidth);
    }
  }
  if (error != cudaSuccess) return error;
  // One CTA per SM (the setmaxnreg budgets assume it), each taking every grid-th tile.
  const int64_t tiles = host_util::ceil_div(p.seq_q, SHAPE::kBlockM) * p.heads_q * p.batch;
  if (tiles > INT_MAX) return cudaErrorInvalidValue;
  int ctas = 0;
  error = persistent_grid<attention_sm90_kernel<T, D, INT8, SHAPE>>(SHAPE::kThreads, kSmem, &ctas);
  if (error != cudaSuccess) return error;
  attention_sm90_kernel<T, D, INT8, SHAPE><<<static_cast<unsigned>(tiles < ctas ? tiles : ctas), SHAPE::kThreads, kSmem, stream>>>(p, w, maps);
  return cudaGetLastError();
}

// The tile shapes, from a sweep on an H100 (benchmarks/results/h100/attention_tiles.md): 128
// keys per step; at head_dim 64 three consumer warpgroups (192 query rows per CTA) run ~1.1x
// faster per row than two, unless the grid's last wave is then emptier (few CTAs: a short
// sequence or few heads); at 128, two (three do not fit their registers).
using NarrowTile = TileShape<2, 128>;
using WideTile = TileShape<3, 128>;

// Whether the wide tile is worth it: query rows per SM, counting the last wave as full.
bool wide_tile_pays(const AttentionParams& p) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    return false;
  }
  const auto wave_rows = [&](int64_t block_m) {
    const int64_t ctas = host_util::ceil_div(p.seq_q, block_m) * p.heads_q * p.batch;
    return host_util::ceil_div(ctas, static_cast<int64_t>(sms)) * block_m;
  };
  return wave_rows(WideTile::kBlockM) * 10 <= wave_rows(NarrowTile::kBlockM) * 11;
}

template <typename T, int D, bool INT8>
cudaError_t launch_shape(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  if constexpr (D == 64) {
    if (wide_tile_pays(p)) return launch_kernel<T, D, INT8, WideTile>(p, w, stream);
  }
  return launch_kernel<T, D, INT8, NarrowTile>(p, w, stream);
}

template <typename T, int D>
cudaError_t launch_typed(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  return p.precision == AttentionPrecision::kInt8QK ? launch_shape<T, D, true>(p, w, stream)
                                                    : launch_shape<T, D, false>(p, w, stream);
}

template <typename T>
cudaError_t launch_dim(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  return p.head_dim == 64 ? launch_typed<T, 64>(p, w, stream) : launch_typed<T, 128>(p, w, stream);
}

template <typename T, int D>
cudaError_t launch_short_typed(const AttentionParams& p, cudaStream_t stream) {
  constexpr int kSmem = 1024 /* base alignment */ + core::SmemTile<static_cast<int>(kShortMaxKeys), D * 2>::kBytes +
                        core::SmemTile<D, static_cast<int>(kShortMaxKeys) * 2>::kBytes +
                        2 * core::SmemTile<kRowsPerConsumer, D * 2>::kBytes + static_cast<int>(kShortMaxKeys) * 4;
  int grid = 0;
  if (const cudaError_t error = persistent_grid<attention_short_sm90_kernel<T, D>>(kShortThreads, kSmem, &grid);
      error != cudaSuccess) {
    return error;
  }
  const int64_t items = p.batch * p.heads_q * host_util::ceil_div(p.seq_q, kRowsPerConsumer);
  const unsigned blocks = static_cast<unsigned>(items < grid ? items : grid);
  attention_short_sm90_kernel<T, D><<<blocks, kShortThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_short_hopper(const AttentionParams& p, cudaStream_t stream) {
  if (!uses_short_kernel(p) || p.arch / 10 != 9) return cudaErrorInvalidValue;
  if (p.dtype == DType::kBFloat16) {
    return p.head_dim == 64 ? launch_short_typed<__nv_bfloat16, 64>(p, stream)
                            : launch_short_typed<__nv_bfloat16, 128>(p, stream);
  }
  return p.head_dim == 64 ? launch_short_typed<__half, 64>(p, stream) : launch_short_typed<__half, 128>(p, stream);
}

cudaError_t launch_hopper(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  if (!uses_hopper_kernel(p)) return cudaErrorInvalidValue;
  return p.dtype == DType::kBFloat16 ? launch_dim<__nv_bfloat16>(p, w, stream) : launch_dim<__half>(p, w, stream);
}

}  // namespace ltx_kernels

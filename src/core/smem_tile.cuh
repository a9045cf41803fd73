// A ROWS x ROW_BYTES tile in shared memory in the layout Hopper's wgmma reads with a swizzled
// K-major descriptor, and that ldmatrix reads without bank conflicts: the rows are cut into
// column blocks of W = min(ROW_BYTES, 128) bytes (block b holds bytes [b W, b W + W) of every
// row, rows W apart), and within a block the 16-byte chunks of row r are XOR-permuted by r
// (CuTe's Swizzle<3,4,3> for W = 128, Swizzle<2,4,3> for W = 64: the 8 rows one ldmatrix or
// one wgmma core matrix touches at a chunk column land in 8 different bank groups). The tile
// base must be 1024-byte aligned, so the pattern's phase starts at 0.
#pragma once

#include <cstdint>

#include "core/mma.cuh"

namespace ltx_kernels::core {

template <int ROWS, int ROW_BYTES>
struct SmemTile {
  static_assert(ROW_BYTES % 64 == 0 && ROWS % 8 == 0);
  static constexpr int kRows = ROWS;
  static constexpr int kWidth = ROW_BYTES < 128 ? ROW_BYTES : 128;  // swizzle width, bytes
  static constexpr int kBytes = ROWS * ROW_BYTES;
  static constexpr int kChunks = ROW_BYTES / 16;  // 16-byte chunks per row

  // Byte offset of 16-byte chunk `chunk` of row `row`.
  __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    constexpr int kBlockChunks = kWidth / 16, kRowsPerLine = 128 / kWidth, kPhases = 8 / kRowsPerLine;
    const int block = chunk / kBlockChunks, c = chunk % kBlockChunks;
    return block * ROWS * kWidth + row * kWidth + ((c ^ ((row / kRowsPerLine) % kPhases)) << 4);
  }

  // Rows [row0, row0 + ROWS) of a matrix of `rows` rows, `stride` bytes apart, copied into the
  // tile asynchronously by THREADS threads (threadIdx.x < THREADS); rows past the end become
  // zeros. Commit and wait with cp_async_commit / cp_async_wait. Thread t copies chunk
  // t % kChunks of rows t / kChunks + i * kRowStep: kRowStep is a multiple of 8, so the
  // swizzle phase is the same for all of them and both addresses step by constants (a few
  // instructions per 16 bytes: this runs once per tile in the attention kernels' loops).
  template <int THREADS>
  __device__ __forceinline__ static void load(uint32_t tile, const char* base, int64_t stride, int row0, int rows) {
    static_assert(THREADS % kChunks == 0 && ROWS * kChunks % THREADS == 0);
    constexpr int kRowStep = THREADS / kChunks;
    static_assert(kRowStep % 8 == 0, "the swizzle phase must repeat every kRowStep rows");
    const int r0 = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
    const uint32_t dst = tile + offset(r0, c);
    const char* src = base + static_cast<int64_t>(row0 + r0) * stride + c * 16;
#pragma unroll
    for (int i = 0; i < ROWS / kRowStep; ++i) {
      const bool valid = row0 + r0 + i * kRowStep < rows;
      cp_async_16(dst + i * kRowStep * kWidth, valid ? src : base, valid);
      src += kRowStep * stride;
    }
  }
};

}  // namespace ltx_kernels::core

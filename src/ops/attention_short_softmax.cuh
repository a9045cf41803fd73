// The softmax of the short-key attention kernels (attention_short.cu, mma.sync; its Hopper form
// in attention_sm90.cu, wgmma): a warp's 16 query rows against all of at most 128 keys at once,
// the scores in registers in the m16n8 accumulator layout, element e of 8-key tile j being row
// g + 8 (e / 2), key 8 j + 2 tig + e % 2 (g = lane / 4, tig = lane % 4).
#pragma once

#include <cmath>

#include "core/activation.cuh"
#include "ltx_kernels/attention.h"

namespace ltx_kernels::attention_short {

using core::kLog2e;

// Scales `score(j, e)` (a float&) to log2 units by `factor` and masks it: with `row_masks`, by
// p.mask's rows row_lo and row_lo + 8 of (batch b, head h) (natural-log units; the last row
// where those lie past seq_q, whose rows are not stored; keys past seq_k masked out), or else
// by `bias` (one log2-unit bias per key, -inf past seq_k, in shared memory); then replaces each
// score by its exp2 against its row's max, adding them into `part_sum` (per row, even and odd
// key tiles apart; the caller adds the two and across the row's 4 threads).
// (two partial maxima and sums per row, for even and odd key tiles: shorter dependency chains)
template <int NTILES, class Score>
__device__ __forceinline__ void softmax(Score score, float factor, const AttentionParams& p, int64_t b, int64_t h,
                                        int row_lo, int seq_q, bool row_masks, const float* bias, int seq_k, int tig,
                                        float (&part_sum)[2][2]) {
  float part_max[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
  if (row_masks) {
    const float* head_mask = p.mask + b * p.mask_strides.batch + h * p.mask_strides.head;
    const float* mask[2] = {head_mask + min(row_lo, seq_q - 1) * p.mask_strides.seq,
                            head_mask + min(row_lo + 8, seq_q - 1) * p.mask_strides.seq};
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = 8 * j + 2 * tig + e % 2;
        float x = -INFINITY;
        if (key < seq_k) x = fmaf(mask[e / 2][key], kLog2e, score(j, e) * factor);
        score(j, e) = x;
        part_max[e / 2][j % 2] = fmaxf(part_max[e / 2][j % 2], x);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
      const float2 kb = *reinterpret_cast<const float2*>(bias + 8 * j + 2 * tig);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = fmaf(score(j, e), factor, e % 2 ? kb.y : kb.x);
        score(j, e) = x;
        part_max[e / 2][j % 2] = fmaxf(part_max[e / 2][j % 2], x);
      }
    }
  }
  float row_max[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_max[r] = fmaxf(part_max[r][0], part_max[r][1]);
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
    // A row with every key masked has max -inf; exp2 of its scores must give 0, not NaN.
    if (row_max[r] == -INFINITY) row_max[r] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < NTILES; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      score(j, e) = core::fast_exp2(score(j, e) - row_max[e / 2]);
      part_sum[e / 2][j % 2] += score(j, e);
    }
  }
}

}  // namespace ltx_kernels::attention_short

// The O += P V step of the mma.sync attention kernels (attention.cu's portable kernel and
// attention_short.cu), one 16-key k-step at a time: P comes from registers, V from a row-major
// shared-memory tile (core::SmemTile, rows = keys).
#pragma once

#include <cstdint>

#include "core/mma.cuh"

namespace ltx_kernels::attention_mma {

// o[t] (output columns 8 t .. 8 t + 7 of the warp's 16 rows) += P V over keys key0 .. key0 + 15.
// P's accumulator layout of two adjacent 8-key score tiles (s0: keys key0 .., s1: key0 + 8 ..)
// is the A fragment of one k-step; V's B fragments come from ldmatrix.trans of the tile.
template <typename T, class VTILE, int DTILES>
__device__ __forceinline__ void pv_step(float (&o)[DTILES][4], const float (&s0)[4], const float (&s1)[4],
                                        uint32_t v_tile, int key0, int lane) {
  const uint32_t pa[4] = {core::pack2<T>(s0[0], s0[1]), core::pack2<T>(s0[2], s0[3]), core::pack2<T>(s1[0], s1[1]),
                          core::pack2<T>(s1[2], s1[3])};
#pragma unroll
  for (int t = 0; t < DTILES; t += 2) {
    uint32_t vb[4];  // B fragments of output tiles t and t + 1
    const int mi = lane / 8;
    core::ldmatrix_x4_trans(vb, v_tile + VTILE::offset(key0 + (mi % 2) * 8 + lane % 8, t + mi / 2));
    core::mma_16816<T>(o[t], pa, vb[0], vb[1]);
    core::mma_16816<T>(o[t + 1], pa, vb[2], vb[3]);
  }
}

}  // namespace ltx_kernels::attention_mma

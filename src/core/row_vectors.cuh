// Device side of RowVectors (types.h): this row's vector of a broadcast [D] / [B, 1, D] /
// per-token tensor.
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

namespace ltx_kernels::core {

// Pointer to row `row`'s vector (rows are [rows / tokens, tokens]); nullptr when absent.
// Divides in 32 bits whenever the operands fit: a 64-bit division is a ~70-instruction
// software routine, which shows in kernels that run at memory speed.
template <typename T>
__device__ __forceinline__ const T* row_vector(const RowVectors& v, int64_t row, int64_t tokens) {
  if (!v.ptr) return nullptr;
  int64_t batch;
  if (row <= UINT32_MAX && tokens <= UINT32_MAX) {
    batch = static_cast<uint32_t>(row) / static_cast<uint32_t>(tokens);
  } else {
    batch = row / tokens;
  }
  const int64_t token = row - batch * tokens;
  return static_cast<const T*>(v.ptr) + batch * v.batch_stride + token * v.token_stride;
}

}  // namespace ltx_kernels::core

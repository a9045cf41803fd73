// Small helpers shared by the host-side planners of every op family.
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

namespace ltx_kernels::host_util {

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Whether every vector of a RowVectors starts 16-byte aligned when read `vec` elements at a
// time (absent vectors are trivially aligned).
inline bool aligned_vectors(const RowVectors& v, int vec) {
  return aligned16(v.ptr) && v.batch_stride % vec == 0 && v.token_stride % vec == 0;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Devices with a slot in the launchers' per-device caches; a device beyond is looked up each call.
constexpr int kMaxDevices = 64;

}  // namespace ltx_kernels::host_util

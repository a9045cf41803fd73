// Host conversions between storage dtypes and float, rounding to nearest even like the GPU.
#pragma once

#include <cstdint>
#include <cstring>

#include "ltx_kernels/types.h"

namespace ltx_kernels::host {

inline float bf16_to_float(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &widened, sizeof(f));
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// _Float16 (GCC >= 12, Clang) converts with IEEE round-to-nearest-even, subnormals included.
inline float load(const void* base, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat16: return static_cast<float>(static_cast<const _Float16*>(base)[i]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.0f;
}

inline void store(void* base, int64_t i, DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[i] = v; return;
    case DType::kFloat16: static_cast<_Float16*>(base)[i] = static_cast<_Float16>(v); return;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = float_to_bf16(v); return;
  }
}

// Value after a round trip through dtype.
inline float round_to(float v, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return v;
    case DType::kFloat16: return static_cast<float>(static_cast<_Float16>(v));
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(v));
  }
  return v;
}

}  // namespace ltx_kernels::host

// Host conversions between storage dtypes and float, rounding to nearest even like the GPU.
#pragma once

#include <cmath>
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

// float -> float8 e4m3fn bits, round to nearest even, saturating finite values to +-448 and
// NaN to 0x7f, as the GPU's cvt.rn.satfinite.e4m3 does.
inline uint8_t float_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) {  // below 2^-6: subnormal, steps of 2^-9 (8 steps: the first normal)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  uint32_t u;
  std::memcpy(&u, &a, sizeof(u));
  const uint32_t exponent = (u >> 23) - 127 + 7;
  const uint32_t mantissa = u & 0x7fffffu;
  const uint32_t kept = mantissa >> 20, rest = mantissa & 0xfffffu;
  const uint32_t round_up = rest > 0x80000u || (rest == 0x80000u && (kept & 1u));
  const uint32_t code = (exponent << 3) + kept + round_up;  // a carry moves into the exponent
  return sign | static_cast<uint8_t>(code > 0x7eu ? 0x7eu : code);
}

// float8 e4m3fn bits -> value: exponent bias 7, subnormals (steps of 2^-9) below 2^-6,
// 0x7f / 0xff NaN, no inf.
inline float e4m3_to_float(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xf, mantissa = bits & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::nanf("");
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return bits & 0x80 ? -magnitude : magnitude;
}

}  // namespace ltx_kernels::host

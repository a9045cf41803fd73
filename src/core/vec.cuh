// Vectors of N elements loaded and stored as one access (16 bytes when N * sizeof(T) == 16).
// Callers guarantee alignment (the launchers check pointers and strides before choosing N > 1).
// Vectors stay in their storage dtype (half the registers of fp32 for 16-bit types) and are
// widened to fp32 for math.
#pragma once

#include <cstdint>

#include "core/convert.cuh"

namespace ltx_kernels::core {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Widened copy of a vector, for fp32 math.
template <int N>
struct Floats {
  float v[N];
};

// Builtin type of the same size as a vector: the cache-hint intrinsics take only those.
template <int BYTES>
struct Raw;
template <>
struct Raw<16> { using type = uint4; };
template <>
struct Raw<8> { using type = uint2; };
template <>
struct Raw<4> { using type = unsigned int; };
template <>
struct Raw<2> { using type = unsigned short; };
template <>
struct Raw<1> { using type = unsigned char; };

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> from_raw(const typename Raw<sizeof(T) * N>::type& raw) {
  Vec<T, N> vec;
  memcpy(&vec, &raw, sizeof(vec));
  return vec;
}

// Data read once (activations): cache-streaming, evicted first.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_stream(const T* ptr) {
  using R = typename Raw<sizeof(T) * N>::type;
  return from_raw<T, N>(__ldcs(reinterpret_cast<const R*>(ptr)));
}


// Through the builtin type and a store intrinsic (default write-back policy), like the
// loads: a plain copy of a Vec of 16-bit elements is split into 2- or 4-byte stores
// (seen for bf16 in the elementwise kernels, where it halved the bandwidth).
template <typename T, int N>
__device__ __forceinline__ void store(T* ptr, const Vec<T, N>& vec);

// Read-only data reused across rows (weights): the read-only cache path, kept cached.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_cached(const T* ptr);

// W elements as W / A accesses of A elements each: A = W when the data is aligned for it,
// smaller otherwise (the vector's size and the data's alignment are chosen separately).
// `load` reads A elements (a lambda wrapping load_stream or load_cached, so it inlines).
template <typename T, int W, int A, typename Load>
__device__ __forceinline__ Vec<T, W> load_parts(const T* ptr, Load load) {
  static_assert(W % A == 0);
  Vec<T, W> vec;
#pragma unroll
  for (int i = 0; i < W / A; ++i) {
    const Vec<T, A> part = load(ptr + i * A);
    memcpy(vec.v + i * A, part.v, sizeof(part));
  }
  return vec;
}

template <typename T, int W, int A>
__device__ __forceinline__ Vec<T, W> load_stream_parts(const T* ptr) {
  return load_parts<T, W, A>(ptr, [](const T* at) { return load_stream<T, A>(at); });
}

template <typename T, int W, int A>
__device__ __forceinline__ Vec<T, W> load_cached_parts(const T* ptr) {
  return load_parts<T, W, A>(ptr, [](const T* at) { return load_cached<T, A>(at); });
}

template <typename T, int W, int A>
__device__ __forceinline__ void store_parts(T* ptr, const Vec<T, W>& vec) {
  static_assert(W % A == 0);
#pragma unroll
  for (int i = 0; i < W / A; ++i) {
    Vec<T, A> part;
    memcpy(part.v, vec.v + i * A, sizeof(part));
    store(ptr + i * A, part);
  }
}

// load_cached and store of a vector wider than 16 bytes (fp32 weights beside 16-bit
// activations) take 16-byte parts.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_cached(const T* ptr) {
  if constexpr (sizeof(T) * N > 16) {
    return load_cached_parts<T, N, 16 / sizeof(T)>(ptr);
  } else {
    using R = typename Raw<sizeof(T) * N>::type;
    return from_raw<T, N>(__ldg(reinterpret_cast<const R*>(ptr)));
  }
}

template <typename T, int N>
__device__ __forceinline__ void store(T* ptr, const Vec<T, N>& vec) {
  if constexpr (sizeof(T) * N > 16) {
    store_parts<T, N, 16 / sizeof(T)>(ptr, vec);
  } else {
    using R = typename Raw<sizeof(T) * N>::type;
    R raw;
    memcpy(&raw, &vec, sizeof(raw));
    __stwb(reinterpret_cast<R*>(ptr), raw);
  }
}

// A vector of zeros (all-zero bits are 0 in float, half and bfloat16).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> zeros() {
  Vec<T, N> vec;
  memset(&vec, 0, sizeof(vec));
  return vec;
}

// 16-bit elements are widened and rounded in pairs through 32-bit words: element access has
// the compiler unpack each 16-bit element into a register of its own, twice the registers of
// the packed vector. ptxas, the bf16 norm kernels: 17 of 618 spilled, none now; the layer norm
// with 4 vectors a thread 64 -> 47 registers (benchmarks/results/h200/norm_plans.md).
template <typename T, int N>
__device__ __forceinline__ Floats<N> widen(const Vec<T, N>& vec) {
  Floats<N> out;
  if constexpr (sizeof(T) == 2 && N % 2 == 0) {
    unsigned int words[N / 2];
    memcpy(words, &vec, sizeof(words));
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float2 f = pair_to_float2<T>(words[i]);
      out.v[2 * i] = f.x;
      out.v[2 * i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out.v[i] = to_float(vec.v[i]);
  }
  return out;
}

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> narrow(const Floats<N>& f) {
  Vec<T, N> out;
  if constexpr (sizeof(T) == 2 && N % 2 == 0) {
    unsigned int words[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) words[i] = pair_from_floats<T>(f.v[2 * i], f.v[2 * i + 1]);
    memcpy(&out, words, sizeof(words));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out.v[i] = from_float<T>(f.v[i]);
  }
  return out;
}

}  // namespace ltx_kernels::core

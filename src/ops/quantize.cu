// CUDA kernel and launcher of FP8 row quantization (see include/ltx_kernels/quantize.h).
//
// TPR threads per row (32..256, rows of a block side by side) hold up to kItems vectors of
// the row each in registers: one read for the row max and the quantization; a longer row is
// re-read for its remaining vectors (from L2). The divisions are IEEE (__fdiv_rn) and the
// product unfused, so the bytes equal the CPU reference's.
#include "core/activation.cuh"
#include "core/fp8.cuh"
#include "core/reduce.cuh"
#include "core/vec.cuh"
#include "ltx_kernels/quantize.h"
#include "ops/host_util.h"

namespace ltx_kernels {
namespace {

using core::Floats;
using core::Vec;

constexpr int kThreads = 256;
constexpr int kItems = 4;

// The row's values in fp32: x, or the activation of x.
template <Fp8Activation ACT, typename T, int N>
__device__ __forceinline__ Floats<N> values(const Vec<T, N>& v) {
  Floats<N> f = core::widen(v);
  if constexpr (ACT == Fp8Activation::kGeluTanh) {
#pragma unroll
    for (int j = 0; j < N; ++j) f.v[j] = core::gelu_tanh(f.v[j]);
  }
  return f;
}

// What a thread keeps of its first kItems vectors between the row max and the quantization:
// the inputs as loaded (half the registers of fp32), or, with an activation, its fp32 values:
// computing GELU twice made the pass bound by the SFU, not by memory (H100, 16128 x 8192 in
// bf16: 1.4 TB/s).
template <Fp8Activation ACT, typename T, int N>
struct Kept {
  Vec<T, N> v;
  __device__ __forceinline__ void set(const Vec<T, N>& x) { v = x; }
  __device__ __forceinline__ Floats<N> get() const { return values<ACT>(v); }
};
template <typename T, int N>
struct Kept<Fp8Activation::kGeluTanh, T, N> {
  Floats<N> f;
  __device__ __forceinline__ void set(const Vec<T, N>& x) { f = values<Fp8Activation::kGeluTanh>(x); }
  __device__ __forceinline__ Floats<N> get() const { return f; }
};

// With GELU, at least 5 blocks an SM (48 registers, 8 bytes spilled): one row per block at
// 8192 columns and its fp32 values kept (Kept) took 57 registers, 4 blocks, too few rows'
// loads in flight (H100, 16128 x 8192 bf16: 2.0 TB/s). 0: no bound for the plain pass.
template <typename T, int N, int TPR, Fp8Activation ACT>
__global__ void __launch_bounds__(kThreads, ACT == Fp8Activation::kGeluTanh ? 5 : 0)
    quantize_fp8_kernel(const QuantizeParams p) {
  constexpr int kRowsPerBlock = kThreads / TPR;
  __shared__ float scratch[core::kMaxWarpsPerBlock];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  const bool active = row < p.rows;
  const T* x = static_cast<const T*>(p.x) + (active ? row : 0) * p.x_row_stride;
  const int64_t nvec = p.cols / N;
  const auto col = [&](int64_t i) { return (threadIdx.x + i * TPR) * N; };
  const auto valid = [&](int64_t i) { return active && threadIdx.x + i * TPR < nvec; };

  Kept<ACT, T, N> cached[kItems];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    cached[i].set(valid(i) ? core::load_stream<T, N>(x + col(i)) : core::zeros<T, N>());
    core::absmax_into(amax, cached[i].get());
  }
  for (int64_t i = kItems; valid(i); ++i) core::absmax_into(amax, values<ACT>(core::load_cached<T, N>(x + col(i))));
  amax = core::row_reduce<TPR>(amax, scratch, core::NanMax{});
  if (!active) return;

  const core::Fp8Row fp8 = core::fp8_row(amax);
  if (threadIdx.x == 0) p.scale[row] = fp8.scale;
  uint8_t* out = p.out + row * p.out_row_stride;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (valid(i)) core::store(out + col(i), core::to_e4m3(cached[i].get(), fp8.inv));
  }
  for (int64_t i = kItems; valid(i); ++i) {
    core::store(out + col(i), core::to_e4m3(values<ACT>(core::load_stream<T, N>(x + col(i))), fp8.inv));
  }
}

template <typename T, int N, int TPR>
cudaError_t launch_tpr(const QuantizeParams& p, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kThreads / TPR;
  const dim3 block(TPR, kRowsPerBlock);
  const int64_t blocks = host_util::ceil_div(p.rows, kRowsPerBlock);
  if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
  if (p.activation == Fp8Activation::kGeluTanh) {
    quantize_fp8_kernel<T, N, TPR, Fp8Activation::kGeluTanh><<<static_cast<unsigned>(blocks), block, 0, stream>>>(p);
  } else {
    quantize_fp8_kernel<T, N, TPR, Fp8Activation::kNone><<<static_cast<unsigned>(blocks), block, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

// Threads per row: enough for the row to fit in registers (kItems vectors each), at least
// a warp, at most the block.
template <typename T, int N>
cudaError_t launch_vec(const QuantizeParams& p, cudaStream_t stream) {
  const int64_t per_thread = host_util::ceil_div(p.cols / N, kItems);
  if (per_thread <= 32) return launch_tpr<T, N, 32>(p, stream);
  if (per_thread <= 64) return launch_tpr<T, N, 64>(p, stream);
  if (per_thread <= 128) return launch_tpr<T, N, 128>(p, stream);
  return launch_tpr<T, N, 256>(p, stream);
}

template <typename T>
cudaError_t launch_typed(const QuantizeParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  return quantize_vector(p) == kVec ? launch_vec<T, kVec>(p, stream) : launch_vec<T, 1>(p, stream);
}

}  // namespace

cudaError_t launch(const QuantizeParams& p, cudaStream_t stream) {
  if (validate(p) != nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32: return launch_typed<float>(p, stream);
    case DType::kFloat16: return launch_typed<__half>(p, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx_kernels

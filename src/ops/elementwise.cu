// CUDA kernels and launcher of the elementwise family (see include/ltx_kernels/elementwise.h).
//
// A block covers up to 256 vectors of a row (several blocks side by side for wide rows) and
// kRowsPerThread rows, whose loads are all issued before any math so that each thread has
// several 16-byte loads in flight: at memory speed, bytes in flight per SM is what counts.
// The math must stay cheap next to the memory time (a few instructions per element).
#include <climits>

#include "core/activation.cuh"
#include "core/row_vectors.cuh"
#include "core/vec.cuh"
#include "ltx_kernels/elementwise.h"

namespace ltx_kernels {
namespace {

using core::Floats;
using core::Vec;

constexpr int kThreads = 256;
// Two rows' loads in flight per thread, at <= 64 registers so that 4 blocks (a full SM of
// threads) stay resident: holding 4 rows took up to 128 registers and ran at 50-80%.
constexpr int kRowsPerThread = 2;
// The gated residual also holds a gate vector per row, the backward ops a gradient vector
// (and write two outputs): 3 blocks (85 registers) spare them the spill that 64 registers
// cause in bf16.
template <ElementwiseOp OP>
constexpr int kMinBlocksPerSm = OP == ElementwiseOp::kGatedResidual || is_backward(OP) ? 3 : 4;
constexpr unsigned kMaxGridY = 65535;

template <ElementwiseOp OP>
__device__ __forceinline__ float apply(float a, float b, float gate) {
  if constexpr (OP == ElementwiseOp::kGeluTanh) return core::gelu_tanh(a);
  if constexpr (OP == ElementwiseOp::kGeluTanhAndMul) return core::gelu_tanh(a) * b;
  if constexpr (OP == ElementwiseOp::kGeluAndMul) return core::gelu(a) * b;
  if constexpr (OP == ElementwiseOp::kSiluAndMul) return core::silu(a) * b;
  if constexpr (OP == ElementwiseOp::kGatedResidual) return fmaf(b, gate, a);
}

// The activation of a backward op, with its derivative.
template <ElementwiseOp OP>
__device__ __forceinline__ core::ValueAndSlope activation_and_slope(float a) {
  if constexpr (OP == ElementwiseOp::kGeluAndMulBackward) return core::gelu_and_slope(a);
  if constexpr (OP == ElementwiseOp::kSiluAndMulBackward) return core::silu_and_slope(a);
  if constexpr (OP == ElementwiseOp::kGeluTanhBackward || OP == ElementwiseOp::kGeluTanhAndMulBackward)
    return core::gelu_tanh_and_slope(a);
}

template <typename T, int N, ElementwiseOp OP>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<OP>) elementwise_kernel(const ElementwiseParams p) {
  constexpr bool kHasB = has_b(OP);
  constexpr bool kHasGate = OP == ElementwiseOp::kGatedResidual;
  constexpr bool kBackward = is_backward(OP);
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * N;
  if (col >= p.cols) return;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  const T* grad = static_cast<const T*>(p.grad);
  T* out = static_cast<T*>(p.out);
  T* out_b = static_cast<T*>(p.out_b);
  for (int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRowsPerThread; row0 < p.rows;
       row0 += static_cast<int64_t>(gridDim.y) * kRowsPerThread) {
    // gv holds the gate (gated residual) or the incoming gradient (backward ops).
    Vec<T, N> av[kRowsPerThread], bv[kRowsPerThread], gv[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int64_t row = row0 + i;
      if (row >= p.rows) break;
      av[i] = core::load_stream<T, N>(a + row * p.a_row_stride + col);
      if constexpr (kHasB) bv[i] = core::load_stream<T, N>(b + row * p.b_row_stride + col);
      if constexpr (kHasGate) {
        const T* gate = core::row_vector<T>(p.gate, row, p.tokens);
        gv[i] = gate ? core::load_cached<T, N>(gate + col) : Vec<T, N>{};
      }
      if constexpr (kBackward) gv[i] = core::load_stream<T, N>(grad + row * p.grad_row_stride + col);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int64_t row = row0 + i;
      if (row >= p.rows) break;
      const Floats<N> af = core::widen(av[i]);
      Floats<N> bf{}, gf{};
      if constexpr (kHasB) bf = core::widen(bv[i]);
      if constexpr (kHasGate) {
        if (p.gate.ptr) {
          gf = core::widen(gv[i]);
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) gf.v[j] = 1.0f;
        }
      }
      if constexpr (kBackward) {
        gf = core::widen(gv[i]);
        Floats<N> da, db;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const core::ValueAndSlope act = activation_and_slope<OP>(af.v[j]);
          da.v[j] = kHasB ? gf.v[j] * bf.v[j] * act.slope : gf.v[j] * act.slope;
          db.v[j] = gf.v[j] * act.value;
        }
        core::store(out + row * p.out_row_stride + col, core::narrow<T>(da));
        if constexpr (kHasB) core::store(out_b + row * p.out_b_row_stride + col, core::narrow<T>(db));
      } else {
        Floats<N> y;
#pragma unroll
        for (int j = 0; j < N; ++j) y.v[j] = apply<OP>(af.v[j], bf.v[j], gf.v[j]);
        core::store(out + row * p.out_row_stride + col, core::narrow<T>(y));
      }
    }
  }
}

template <typename T, int N>
cudaError_t launch_vec(const ElementwiseParams& p, cudaStream_t stream) {
  const int64_t vectors = p.cols / N;
  const int64_t col_blocks = (vectors + kThreads - 1) / kThreads;
  const int64_t row_groups = (p.rows + kRowsPerThread - 1) / kRowsPerThread;
  if (col_blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>(row_groups < kMaxGridY ? row_groups : kMaxGridY));
  switch (p.op) {
    case ElementwiseOp::kGeluTanh:
      elementwise_kernel<T, N, ElementwiseOp::kGeluTanh><<<grid, kThreads, 0, stream>>>(p);
      break;
    case ElementwiseOp::kGeluTanhAndMul:
      elementwise_kernel<T, N, ElementwiseOp::kGeluTanhAndMul><<<grid, kThreads, 0, stream>>>(p);
      break;
    case ElementwiseOp::kGeluAndMul:
      elementwise_kernel<T, N, ElementwiseOp::kGeluAndMul><<<grid, kThreads, 0, stream>>>(p);
      break;
    case ElementwiseOp::kSiluAndMul:
      elementwise_kernel<T, N, ElementwiseOp::kSiluAndMul><<<grid, kThreads, 0, stream>>>(p);
      break;
    case ElementwiseOp::kGatedResidual:
      elementwise_kernel<T, N, ElementwiseOp::kGatedResidual><<<grid, kThreads, 0, stream>>>(p);
      break;
    case ElementwiseOp::kGeluTanhBackward:
      elementwise_kernel<T, N, ElementwiseOp::kGeluTanhBackward><<<grid, kThreads, 0, stream>>>(p);
      break;
    case ElementwiseOp::kGeluTanhAndMulBackward:
      elementwise_kernel<T, N, ElementwiseOp::kGeluTanhAndMulBackward><<<grid, kThreads, 0, stream>>>(p);
      break;
    case ElementwiseOp::kGeluAndMulBackward:
      elementwise_kernel<T, N, ElementwiseOp::kGeluAndMulBackward><<<grid, kThreads, 0, stream>>>(p);
      break;
    case ElementwiseOp::kSiluAndMulBackward:
      elementwise_kernel<T, N, ElementwiseOp::kSiluAndMulBackward><<<grid, kThreads, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const ElementwiseParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  return elementwise_vector(p) == kVec ? launch_vec<T, kVec>(p, stream)
                                       : launch_vec<T, 1>(p, stream);
}

}  // namespace

cudaError_t launch(const ElementwiseParams& p, cudaStream_t stream) {
  if (validate(p) != nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32: return launch_typed<float>(p, stream);
    case DType::kFloat16: return launch_typed<__half>(p, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ltx_kernels

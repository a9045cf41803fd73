// Elementwise family: activations (GELU-tanh), gated activations (GEGLU, SwiGLU) and the
// DiT gated residual. One pass over [rows, cols] matrices whose last dim is contiguous and
// whose rows may be strided (e.g. the two halves of a concatenated [.., 2H] projection are
// two matrices with the row stride of the whole). fp32 math, rounded once on store:
//   kGeluTanh        out = gelu_tanh(a)
//   kGeluTanhAndMul  out = gelu_tanh(a) * b
//   kGeluAndMul      out = gelu(a) * b            (exact GELU, erf)
//   kSiluAndMul      out = silu(a) * b
//   kGatedResidual   out = a + b [* gate]         (gate broadcast over rows, absent = 1)
// and the backward of the activations, from grad (d loss / d out of the forward) and the
// forward's inputs (the activation is recomputed from a, not saved):
//   kGeluTanhBackward        out = grad * gelu_tanh'(a)
//   k<Act>AndMulBackward     out = grad * b * act'(a) (d / d a), out_b = grad * act(a) (d / d b)
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

enum class ElementwiseOp : int32_t {
  kGeluTanh = 0,
  kGeluTanhAndMul = 1,
  kGeluAndMul = 2,
  kSiluAndMul = 3,
  kGatedResidual = 4,
  kGeluTanhBackward = 5,
  kGeluTanhAndMulBackward = 6,
  kGeluAndMulBackward = 7,
  kSiluAndMulBackward = 8,
};

constexpr bool is_backward(ElementwiseOp op) { return op >= ElementwiseOp::kGeluTanhBackward; }
// Whether the op reads b (every op but GELU-tanh and its backward) and writes out_b.
constexpr bool has_b(ElementwiseOp op) {
  return op != ElementwiseOp::kGeluTanh && op != ElementwiseOp::kGeluTanhBackward;
}
constexpr bool has_out_b(ElementwiseOp op) { return is_backward(op) && has_b(op); }

struct ElementwiseParams {
  ElementwiseOp op = ElementwiseOp::kGeluTanh;
  DType dtype = DType::kFloat32;  // of every tensor below
  int64_t rows = 0;
  int64_t cols = 0;

  const void* a = nullptr;  // [rows, cols]
  int64_t a_row_stride = 0;
  const void* b = nullptr;  // [rows, cols]; every op but kGeluTanh and its backward
  int64_t b_row_stride = 0;
  const void* grad = nullptr;  // [rows, cols]; the backward ops
  int64_t grad_row_stride = 0;

  // kGatedResidual only, optional; rows are seen as [rows / tokens, tokens] (types.h).
  int64_t tokens = 1;
  RowVectors gate;

  void* out = nullptr;  // [rows, cols]
  int64_t out_row_stride = 0;
  void* out_b = nullptr;  // [rows, cols]; the *AndMulBackward ops (b's gradient)
  int64_t out_b_row_stride = 0;
};

ValidationError validate(const ElementwiseParams& p);

// Plain CPU implementation (double math): the oracle for tests and the CPU dispatch.
void reference(const ElementwiseParams& p);

// Elements per access: 16 bytes when every pointer and row stride allows it, else 1.
int elementwise_vector(const ElementwiseParams& p);

#ifdef LTX_KERNELS_WITH_CUDA
cudaError_t launch(const ElementwiseParams& p, cudaStream_t stream);
#endif

}  // namespace ltx_kernels

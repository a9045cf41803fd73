// FP8 quantization: each row of a [rows, cols] matrix to float8 e4m3 (e4m3fn: max 448, no
// inf) with one fp32 scale per row, the activation format of the FP8 linear path (DESIGN.md
// section 6; weights use the same format, one row per output channel). Exactly:
//   amax  = max(|x[r, :]|) in fp32, NaN if the row has a NaN, at least 1e-12 (a zero row)
//   scale = amax / 448                                  (fp32 division)
//   q     = e4m3(x * (448 / amax))                      (fp32 product, round to nearest even)
// so x ~= q * scale. A row holding inf or NaN gets a NaN or inf scale and NaN elements: its
// GEMM output row is NaN, as the unquantized product's would be non-finite.
// With activation kGeluTanh, x is replaced by gelu_tanh(x) in fp32 first (the FF's GELU fused
// into the quantization of the next GEMM's input; the GPU uses the fast form of
// core/activation.cuh, ~1e-6 relative, so its bytes can differ from the reference's by one
// e4m3 step where a value lies that close to a rounding boundary).
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

constexpr float kFp8E4m3Max = 448.0f;
constexpr float kMinAmax = 1e-12f;  // as torchao: a zero row gets a tiny scale, not 0 / 0

// The activation the FP8 path applies in fp32 where it writes a feed-forward's hidden values:
// here, before quantizing them; in fp8_linear.h, in the up projection's epilogue.
enum class Fp8Activation : int32_t {
  kNone = 0,
  kGeluTanh = 1,
};

struct QuantizeParams {
  DType dtype = DType::kFloat32;  // of x
  Fp8Activation activation = Fp8Activation::kNone;
  int64_t rows = 0;
  int64_t cols = 0;

  const void* x = nullptr;  // [rows, cols], row stride x_row_stride (elements)
  int64_t x_row_stride = 0;

  uint8_t* out = nullptr;  // [rows, cols] e4m3 bytes, row stride out_row_stride
  int64_t out_row_stride = 0;
  float* scale = nullptr;  // [rows]
};

ValidationError validate(const QuantizeParams& p);

// Plain CPU implementation, bit-exact with the CUDA kernel: the oracle and the CPU dispatch.
void reference(const QuantizeParams& p);

// Elements per access: 16 bytes of x when pointers and strides allow it, else 1.
int quantize_vector(const QuantizeParams& p);

#ifdef LTX_KERNELS_WITH_CUDA
cudaError_t launch(const QuantizeParams& p, cudaStream_t stream);
#endif

}  // namespace ltx_kernels

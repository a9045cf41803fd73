// Helpers shared by the torch bindings: argument checks that name the tensor, the view of a
// tensor as a [rows, cols] matrix with strided rows, and running an op on the right device.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "ltx_kernels/norm.h"
#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ltx_kernels::torch_ext {

DType to_dtype(at::ScalarType type);

// Sizes and devices for error messages, formatted without std::ostream (see common.cpp).
std::string dims_str(c10::SymIntArrayRef dims);
std::string device_str(const at::Device& device);

// x is float32/float16/bfloat16 with at least one dim and a contiguous last dim.
void check_activation(const at::Tensor& x, const char* name);

// t has x's dtype, device and shape and a contiguous last dim (x is called `x_name` in the
// messages).
void check_like(const at::Tensor& t, const char* name, const at::Tensor& x, const char* x_name);

// `out`, which op writes, neither overlaps itself (an expanded view) nor shares memory with
// `read`, which op reads while writing it (a kernel may read a row again after writing part of
// it). Meta tensors have no memory: nothing to check.
void check_written(const char* op, const at::Tensor& out, const char* name, const at::Tensor& read,
                   const char* read_name);

// Optional per-channel vector ([cols], like weight or bias) matching x's dtype (or float32,
// where `or_float32` allows it), device and last dim; returned contiguous. (Its errors name
// the argument; the registration's wrapper puts the op's name in front: registration.h.)
std::optional<at::Tensor> channel_vector(const std::optional<at::Tensor>& t, const char* name,
                                         const at::Tensor& x, const char* x_name, bool or_float32 = false);

// Pointer of an optional tensor, nullptr when absent.
inline const void* data_or_null(const std::optional<at::Tensor>& t) {
  return t ? t->const_data_ptr() : nullptr;
}

// A tensor seen as [rows, cols] with a contiguous last dim and a uniform row stride.
struct Rows {
  at::Tensor tensor;  // the input itself, or an explicit contiguous copy
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
};

// Row stride when t's leading dims collapse into one (slices of a wider last dim do),
// std::nullopt otherwise. t's last dim must be contiguous.
std::optional<int64_t> collapsed_row_stride(const at::Tensor& t);

// t as rows, copying it (explicitly, to a contiguous tensor) only when the leading dims
// do not collapse into one row stride.
Rows as_rows(const at::Tensor& t);

// Whether t's rows fill its memory densely, each contiguous (non-overlapping and dense, the
// last dim of stride 1): then a row-wise op with no per-row side input can walk the rows in
// memory order, from t's data pointer, into an output with t's strides, without a copy. True
// for every contiguous tensor and for permuted views such as diffusers' q.transpose(1, 2), a
// [B, S, H, D] tensor read as [B, H, S, D] (whose rows do not collapse into one stride).
// Symbolic-shape safe (Meta under torch.compile decides the output's strides the same way).
bool rows_dense_in_memory(const at::Tensor& t);

// t's rows in memory order (rows_dense_in_memory(t) must hold): row i is the i-th run of
// t.size(-1) elements from t's data pointer.
Rows memory_order_rows(const at::Tensor& t);

// A backward op's gradient of an output: the output's dtype, x's device and shape; any layout
// (autograd may pass an expanded view). x is named x_name in the messages.
void check_grad(const at::Tensor& grad, const char* name, const at::Tensor& x, at::ScalarType out_dtype,
                const char* x_name = "x");

// The gradient of a linear's output x @ weight^T (+ bias): x's dtype and device, shape [..., N]
// with x's leading dims and N = weight.size(0). x is named x_name in the messages.
void check_linear_grad(const at::Tensor& grad_out, const at::Tensor& x, const char* x_name, const at::Tensor& weight);

// The gradient of an output as a backward op's kernel reads it (a contiguous last dim):
// autograd may pass an expanded view, e.g. y.sum()'s gradient has stride 0 everywhere.
at::Tensor last_dim_contiguous(const at::Tensor& grad);

// t itself when its data pointer and every stride (in bytes) are multiples of 16 and its last
// dim is contiguous, as kernels (and cuBLASLt) that move rows 16 bytes at a time need; else a
// fresh contiguous copy. Not contiguous(), which returns a misaligned view as it is (an odd
// storage offset, any stride on a dim of size 1).
at::Tensor aligned16(const at::Tensor& t);

// x seen as [batches, tokens, D] for per-batch and per-token vectors: batches = x.size(0)
// when x has 3 or more dims, else 1.
int64_t batches_of(const at::Tensor& x);

// Checks that t is a [D] vector per row of x that broadcasts as [D], [B, 1, ..., D] (per
// batch) or x's own shape (per token), with x's dtype and device and a contiguous last dim.
// Works on symbolic shapes (Meta).
void check_row_vectors(const at::Tensor& t, const char* name, const at::Tensor& x);

// The RowVectors of a tensor that passed check_row_vectors. `keep` receives the tensor the
// pointer refers to: t itself, or an explicit contiguous copy when its per-token dims do
// not collapse into one stride.
RowVectors row_vectors(const at::Tensor& t, const at::Tensor& x, at::Tensor& keep);

// x @ weight^T + bias rounded once to x's dtype whatever x's layout (bias optional). CUDA's
// at::linear adds the bias in the GEMM's fp32 epilogue; the CPU's rounds x @ weight^T first
// for a strided 16-bit x (bf16 linear_gelu_tanh of a row-strided x: 3% off where the bias
// cancels the product), so the CPU computes it in fp32.
at::Tensor linear_rounded_once(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

// The gelu_tanh op on x's device (elementwise.cpp; our kernel or the C++ reference, accurate in
// the negative tail): for an op that ends in it, e.g. linear_gelu_tanh on the CPU.
at::Tensor gelu_tanh(const at::Tensor& x);

#ifdef LTX_KERNELS_WITH_CUDA
// Raises a ValueError naming the op, the GPU and what it lacks when x's device has a compute
// capability below `minimum` (e.g. 89 for FP8, 80 for mma.sync tensor-core kernels).
void check_compute_capability(const at::Tensor& x, int minimum, const char* op, const char* lacks);
#endif

// The core's own checks (validate(), overloaded on the params type), raised as a ValueError
// naming the op on every device: a CUDA launcher that rejects its params can only return an
// error code, and the CPU reference throws the bare message. The bindings check the arguments
// first, so this fires only when a binding and the core disagree.
template <typename Params>
void check_core(const Params& p, const char* op) {
  if (ValidationError error = validate(p)) TORCH_CHECK_VALUE(false, op, ": ", error);
}

#ifdef LTX_KERNELS_WITH_CUDA
// Runs the op's CUDA launcher (overloaded on the params type) on x's device and current stream.
template <typename Params>
void run_cuda(const Params& p, const at::Tensor& x, const char* op) {
  if (x.scalar_type() == at::kBFloat16) {
    check_compute_capability(x, 80, op, "has no bfloat16 arithmetic (Ampere and newer have it): use float16 or float32");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t error = launch(p, c10::cuda::getCurrentCUDAStream(x.device().index()));
  TORCH_CHECK(error == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(error));
}
#endif

// Runs the op's CPU reference for CPU tensors, or its CUDA launcher on x's device and
// current stream. `launch` and `reference` are overloaded on the params type.
template <typename Params>
void run(const Params& p, const at::Tensor& x, const char* op) {
  check_core(p, op);
  if (x.device().is_cpu()) {
    reference(p);
    return;
  }
#ifdef LTX_KERNELS_WITH_CUDA
  run_cuda(p, x, op);
#else
  TORCH_CHECK(false, op, ": ltx_kernels was built without CUDA support; got a non-CPU tensor");
#endif
}

}  // namespace ltx_kernels::torch_ext

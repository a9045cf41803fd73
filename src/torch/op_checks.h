// Argument checks an op shares with its Meta implementation and its backward op (norm.cpp and
// norm_backward.cpp, elementwise.cpp and elementwise_backward.cpp, linear.cpp, linear_gated_residual.cpp), so that a
// direct call of a backward op gets the forward's messages.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <utility>

namespace ltx_kernels::torch_ext {

using OptTensor = std::optional<at::Tensor>;

// Which weight / bias dtypes an op takes: x's (the AdaLN and FP8 forms), or also float32 (the
// forms torch modules compute, whose parameters a model may keep in float32).
enum class Params { kLikeX, kLikeXOrFloat32 };

// x, the residual, eps, weight and bias; returns weight and bias contiguous, both in x's dtype
// or both in float32 (the kernels read them in one dtype): float32, widened exactly, when
// either is or the output's dtype `out_dtype` is.
std::pair<OptTensor, OptTensor> check_norm_args(const char* op, const at::Tensor& x, const at::Tensor* residual,
                                                const OptTensor& weight, const OptTensor& bias, double eps,
                                                Params params = Params::kLikeX,
                                                at::ScalarType out_dtype = at::ScalarType::Undefined);

// rms_norm's out_dtype: x's dtype (None) or float32.
at::ScalarType norm_out_dtype(const char* op, const at::Tensor& x, std::optional<at::ScalarType> requested);

// AdaLN's scale and shift (both or neither): [D], [B, 1, D] or per token.
void check_modulation(const at::Tensor& x, const at::Tensor* scale, const at::Tensor* shift);

// gated_residual's x, y (x's dtype, device and shape) and gate ([D], [B, 1, D] or per token).
void check_gated_residual(const at::Tensor& x, const at::Tensor& y, const OptTensor& gate);

// linear_gelu_tanh's x, weight [N, K] and bias [N], all in x's dtype and on its device.
void check_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// linear_gated_residual's x [B, S, K], weight [N, K], bias [N], residual [B, S, N] and gate
// ([B, 1, N] or [N]), all in x's dtype and on its device.
void check_linear_gated_residual(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                                 const at::Tensor& residual, const OptTensor& gate);

// The RoPE family's arguments (rope.cpp), as each forward op checks them.
void check_rope_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                     bool interleaved, int64_t unsqueeze_dim, at::OptionalIntArrayRef sections);
void check_ltx_rope_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
void check_ltx_rope_angles_args(const at::Tensor& x, at::IntArrayRef grid, at::ArrayRef<double> axis_scale,
                                const OptTensor& coords, double theta);
void check_ltx_qk_norm_rope_args(const at::Tensor& q, const at::Tensor& k, const OptTensor& weight_q,
                                 const OptTensor& weight_k, double eps, at::IntArrayRef grid,
                                 at::ArrayRef<double> axis_scale, const OptTensor& coords, double theta);

}  // namespace ltx_kernels::torch_ext

// Helpers of the backward ops (norm_backward.cpp, elementwise_backward.cpp): fp32 math on
// upcast inputs, each gradient rounded once to its argument's dtype.
#pragma once

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include <optional>
#include <tuple>

namespace ltx_kernels::torch_ext {

using OptTensor = std::optional<at::Tensor>;
using Grads2 = std::tuple<at::Tensor, at::Tensor>;
using Grads3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

inline at::Tensor f32(const at::Tensor& t) { return t.to(at::kFloat); }

// The gradient of an absent optional argument (autograd.cpp drops it).
inline at::Tensor none_grad(const at::Tensor& x) { return at::empty({0}, x.options()); }

// g summed over the dims that `like` broadcasts over (a [D] weight, a [B, 1, D] scale or
// gate), in like's dtype.
inline at::Tensor reduce_like(const at::Tensor& g, const at::Tensor& like) {
  return at::sum_to(g, like.sym_sizes()).to(like.scalar_type());
}

}  // namespace ltx_kernels::torch_ext

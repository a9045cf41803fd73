// Helpers of the backward ops (norm_backward.cpp, elementwise_backward.cpp): fp32 math on
// upcast inputs, each gradient rounded once to its argument's dtype.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <vector>

namespace ltx_kernels::torch_ext {

using OptTensor = std::optional<at::Tensor>;
using Grads2 = std::tuple<at::Tensor, at::Tensor>;
using Grads3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

inline at::Tensor f32(const at::Tensor& t) { return t.to(at::kFloat); }

// The gradient of an absent optional argument (autograd.cpp drops it).
inline at::Tensor none_grad(const at::Tensor& x) { return at::empty({0}, x.options()); }

// A Meta gradient of argument t: t's shape and dtype, contiguous, as every backward op returns
// its gradients (not empty_like, which keeps a permuted t's strides: torch.compile trusts the
// Meta strides for the real tensors).
inline at::Tensor meta_grad(const at::Tensor& t) { return at::empty_symint(t.sym_sizes(), t.options()); }

// g in dtype, contiguous as meta_grad lays it out (a composite's result can follow a permuted
// input's strides); a copy only where g is not that already.
inline at::Tensor grad_as(const at::Tensor& g, at::ScalarType dtype) {
  // (not g.to(dtype, ..., Contiguous) alone: for the same dtype it returns a permuted g as it
  // is, judging it by suggest_memory_format)
  if (g.scalar_type() == dtype) return g.contiguous();
  return g.to(dtype, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
}

// A fresh contiguous copy of g in dtype, for a gradient that would otherwise be grad_out itself
// or another output (torch's own add hands one tensor to both inputs, but our schemas declare no
// alias between an output and an input or another output).
inline at::Tensor fresh_grad(const at::Tensor& g, at::ScalarType dtype) {
  return g.to(dtype, /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous);
}

// g summed over the dims that `like` broadcasts over (a [D] weight, a [B, 1, D] scale or
// gate), in like's dtype. The sum accumulates and returns fp32 whatever g's dtype, so that a
// 16-bit g needs no fp32 copy first. Always a fresh contiguous tensor (meta_grad's layout):
// where nothing is summed (a per-token shift), g copied, not g itself or a view of it.
inline at::Tensor reduce_like(const at::Tensor& g, const at::Tensor& like) {
  const int64_t lead = g.dim() - like.dim();
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < g.dim(); ++d) {
    if (d < lead || (like.sym_size(d - lead) == 1 && g.sym_size(d) != 1)) dims.push_back(d);
  }
  const at::Tensor sum = dims.empty() ? fresh_grad(g, at::kFloat) : at::sum(g, dims, /*keepdim=*/true, at::kFloat);
  return grad_as(sum.view_symint(like.sym_sizes()), like.scalar_type());
}

}  // namespace ltx_kernels::torch_ext

// Backward op of apply_rotary_pos_emb (the `<op>_backward` of autograd.cpp).
//
// The rotation is linear in q: out[c] = q[c] cos[c] + sign * q[p(c)] sin[c], with p(c) the
// channel paired with c (the other half of its section, or its neighbour when interleaved).
// Its adjoint is the same op with sin'[c] = -sin[p(c)]: the gradients of q and k are one call
// of the forward kernel on the output gradients, with that table. The tables' own gradients
// (rare: models build them without grad) are reductions in fp32.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>
#include <vector>

#include "torch/backward.h"
#include "torch/registration.h"

namespace ltx_kernels::torch_ext {
namespace {

using Rope = std::tuple<at::Tensor, at::Tensor>;

Rope call_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
               bool interleaved, int64_t unsqueeze_dim, at::OptionalIntArrayRef sections) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(LTX_KERNELS_OPS_NAMESPACE_STR "::apply_rotary_pos_emb", "")
                             .typed<Rope(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         bool, int64_t, at::OptionalIntArrayRef)>();
  return op.call(q, k, cos, sin, interleaved, unsqueeze_dim, sections);
}

// t (a table, last dim R) with each channel's value moved to its pair partner. Symbolic
// sizes throughout, so that torch.compile(dynamic=True) traces it.
at::Tensor swap_pairs(const at::Tensor& t, bool interleaved, at::OptionalIntArrayRef sections) {
  const c10::SymInt r = t.sym_size(-1);
  if (interleaved) return t.unflatten_symint(-1, {r / 2, 2}).flip(-1).flatten(-2);
  std::vector<c10::SymInt> sizes{r};
  if (sections) sizes.assign(sections->begin(), sections->end());
  std::vector<at::Tensor> parts;
  c10::SymInt start = 0;
  for (const c10::SymInt& n : sizes) {
    parts.push_back(t.narrow_symint(-1, start + n / 2, n / 2));
    parts.push_back(t.narrow_symint(-1, start, n / 2));
    start = start + n;
  }
  return at::cat(parts, -1);
}

// sum of g * x over what the table broadcasts across (heads, and batch for a [S, R] table),
// on the rotary channels; in the table's dtype and shape.
at::Tensor table_grad(const at::Tensor& gq, const at::Tensor& q, const at::Tensor& gk, const at::Tensor& k,
                      const at::Tensor& table, int64_t unsqueeze_dim) {
  const c10::SymInt r = table.sym_size(-1);
  const at::Tensor t = (table.dim() == 2 ? table.unsqueeze(0) : table).unsqueeze(unsqueeze_dim);
  const auto product = [&](const at::Tensor& g, const at::Tensor& x) {
    return at::sum_to(f32(g).narrow_symint(-1, 0, r) * f32(x).narrow_symint(-1, 0, r), t.sym_sizes());
  };
  at::Tensor sum = product(gq, q);
  if (k.sym_numel() > 0) sum = sum + product(gk, k);
  return sum.reshape_symint(table.sym_sizes()).to(table.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_rotary_pos_emb_backward(
    const at::Tensor& grad_q_out, const at::Tensor& grad_k_out, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& cos, const at::Tensor& sin, bool interleaved, int64_t unsqueeze_dim,
    at::OptionalIntArrayRef sections) {
  // Output gradients may come in any layout (autograd's zeros for an unused output are an
  // expanded scalar); the kernel reads rows with a contiguous last dim.
  const auto [gq, gk] = call_rope(grad_q_out.contiguous(), grad_k_out.contiguous(), cos,
                                  swap_pairs(sin, interleaved, sections).neg(), interleaved, unsqueeze_dim, sections);
  // The rotated inputs rot(q), rot(k): the op with cos 0 and sin 1 (a signed permutation, exact).
  const auto [rq, rk] =
      call_rope(q, k, at::zeros_like(cos), at::ones_like(sin), interleaved, unsqueeze_dim, sections);
  return {gq, gk, table_grad(grad_q_out, q, grad_k_out, k, cos, unsqueeze_dim),
          table_grad(grad_q_out, rq, grad_k_out, rk, sin, unsqueeze_dim)};
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  m.impl("apply_rotary_pos_emb_backward", &apply_rotary_pos_emb_backward);
}

}  // namespace ltx_kernels::torch_ext

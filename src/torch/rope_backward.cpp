// Backward ops of the RoPE family (the `<op>_backward` of autograd.cpp).
//
// Table forms (apply_rotary_pos_emb, ltx_rope): the rotation is linear in q: out[c] = q[c]
// cos[c] + sign * q[p(c)] sin[c], with p(c) the channel paired with c (the other half of its
// section, or its neighbour when interleaved). Its adjoint is the same op with sin'[c] =
// -sin[p(c)]: the gradients of q and k are one call of the forward kernel on the output
// gradients, with that table. The tables' own gradients (rare: models build them without grad)
// are reductions in fp32.
//
// Angle forms (ltx_rope_angles, ltx_qk_norm_rope): each interleaved pair turns by its angle,
// R(a) = [[cos, -sin], [sin, cos]], whose adjoint R(-a) = F R(a) F with F = diag(1, -1): the
// input gradient is the forward kernel on F g, times F (sign flips: exact). The positions
// (video_coords) get d out / d a = (-out_2, out_1) per pair times d a / d position.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "torch/backward.h"
#include "torch/common.h"
#include "torch/op_checks.h"
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

// q and k (x for ltx_rope) are given only when the tables require grad (their gradients are
// the only ones that read them: save_only_when in schemas.cpp); without them the tables get
// none_grad and the checks read the output gradients' shapes instead.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> apply_rotary_pos_emb_backward(
    const at::Tensor& grad_q_out, const at::Tensor& grad_k_out, const OptTensor& q, const OptTensor& k,
    const at::Tensor& cos, const at::Tensor& sin, bool interleaved, int64_t unsqueeze_dim,
    at::OptionalIntArrayRef sections) {
  TORCH_CHECK_VALUE(q.has_value() == k.has_value(), "q and k must be given together");
  // Output gradients may come in any layout (autograd's zeros for an unused output are an
  // expanded scalar); the kernel reads rows with a contiguous last dim.
  const at::Tensor g_q = grad_q_out.contiguous(), g_k = grad_k_out.contiguous();
  if (q) {
    check_rope_args(*q, *k, cos, sin, interleaved, unsqueeze_dim, sections);
    check_grad(grad_q_out, "grad_q_out", *q, q->scalar_type());
    check_grad(grad_k_out, "grad_k_out", *k, k->scalar_type());
  } else {
    check_rope_args(g_q, g_k, cos, sin, interleaved, unsqueeze_dim, sections);
  }
  const auto [gq, gk] =
      call_rope(g_q, g_k, cos, swap_pairs(sin, interleaved, sections).neg(), interleaved, unsqueeze_dim, sections);
  if (!q) return {gq, gk, none_grad(cos), none_grad(sin)};
  // The rotated inputs rot(q), rot(k): the op with cos 0 and sin 1 (a signed permutation, exact).
  const auto [rq, rk] =
      call_rope(*q, *k, at::zeros_like(cos), at::ones_like(sin), interleaved, unsqueeze_dim, sections);
  return {gq, gk, table_grad(grad_q_out, *q, grad_k_out, *k, cos, unsqueeze_dim),
          table_grad(grad_q_out, rq, grad_k_out, rk, sin, unsqueeze_dim)};
}

at::Tensor call_ltx_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(LTX_KERNELS_OPS_NAMESPACE_STR "::ltx_rope", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(x, cos, sin);
}

Grads3 ltx_rope_backward(const at::Tensor& grad_out, const OptTensor& x, const at::Tensor& cos,
                         const at::Tensor& sin) {
  const at::Tensor g = grad_out.contiguous();
  if (x) {
    check_ltx_rope_args(*x, cos, sin);
    check_grad(grad_out, "grad_out", *x, x->scalar_type());
  } else {
    check_ltx_rope_args(g, cos, sin);
  }
  const at::Tensor gx = call_ltx_rope(g, cos, swap_pairs(sin, true, std::nullopt).neg());
  if (!x) return {gx, none_grad(cos), none_grad(sin)};
  const at::Tensor rotated = call_ltx_rope(*x, at::zeros_like(cos), at::ones_like(sin));
  return {gx, reduce_like(f32(g) * f32(*x), cos), reduce_like(f32(g) * f32(rotated), sin)};
}

at::Tensor call_ltx_rope_angles(const at::Tensor& x, at::IntArrayRef grid, at::ArrayRef<double> axis_scale,
                                const OptTensor& coords, double theta) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(LTX_KERNELS_OPS_NAMESPACE_STR "::ltx_rope_angles", "")
                             .typed<at::Tensor(const at::Tensor&, at::IntArrayRef, at::ArrayRef<double>,
                                               const OptTensor&, double)>();
  return op.call(x, grid, axis_scale, coords, theta);
}

// F: -1 on the second channel of each rotated pair (pairs start after the D % 6 channels
// that pass through), +1 elsewhere; as x's dtype, [D].
at::Tensor pair_signs(const at::Tensor& x) {
  const int64_t d = x.size(-1), pass = d % 6;
  at::Tensor f = at::ones({d}, x.options());
  f.narrow(0, pass, d - pass).unflatten(0, {(d - pass) / 2, 2}).select(1, 1).fill_(-1);
  return f;
}

// The adjoint rotation of g: F R(F g).
at::Tensor rotate_back(const at::Tensor& g, at::IntArrayRef grid, at::ArrayRef<double> axis_scale,
                       const OptTensor& coords, double theta) {
  const at::Tensor f = pair_signs(g);
  return call_ltx_rope_angles((g * f).contiguous(), grid, axis_scale, coords, theta) * f;
}

// d loss / d video_coords [B, 3, S] from the output gradients and outputs of the rotations
// (summed over the given pairs (g, out)): per pair j, d a_j = g_1 (-out_2) + g_2 out_1, and
// a_j = freq_{j/3} (2 axis_scale[j%3] coords[j%3] - 1) (rope.h).
at::Tensor coords_grad(const std::vector<std::pair<at::Tensor, at::Tensor>>& grads_and_outs,
                       at::ArrayRef<double> axis_scale, const at::Tensor& coords, double theta) {
  const at::Tensor& any = grads_and_outs.front().second;
  const int64_t d = any.size(-1), pass = d % 6, freqs = d / 6;
  at::Tensor da;  // [B, S, 3 * freqs], fp32
  for (const auto& [g, out] : grads_and_outs) {
    const at::Tensor gp = f32(g).narrow(-1, pass, d - pass).unflatten(-1, {3 * freqs, 2});
    const at::Tensor op = f32(out).narrow(-1, pass, d - pass).unflatten(-1, {3 * freqs, 2});
    const at::Tensor term = op.select(-1, 0) * gp.select(-1, 1) - op.select(-1, 1) * gp.select(-1, 0);
    da = da.defined() ? da + term : term;
  }
  // d a_j / d coords[j % 3] = 2 freq_{j/3} axis_scale[j % 3], as [freqs, 3] (j = 3 k + axis),
  // from tensor ops (the op also runs on fake tensors under torch.compile).
  const auto f64 = da.options().dtype(at::kDouble);
  at::Tensor exponent = at::arange(freqs, f64);
  exponent = freqs > 1 ? exponent / static_cast<double>(freqs - 1) : exponent * 0.0;
  const at::Tensor freq = at::pow(theta, exponent) * (M_PI / 2.0);
  const at::Tensor axes = at::stack({at::full({}, axis_scale[0], f64), at::full({}, axis_scale[1], f64),
                                     at::full({}, axis_scale[2], f64)});
  const at::Tensor slope = (2.0 * freq.unsqueeze(1) * axes.unsqueeze(0)).to(at::kFloat);
  // [B, S, freqs, 3] summed over the frequencies -> [B, S, 3] -> [B, 3, S]
  return (da.unflatten(-1, {freqs, 3}) * slope).sum(-2).transpose(1, 2).to(coords.scalar_type());
}

// x is given only when video_coords requires grad (as for the table forms above).
Grads2 ltx_rope_angles_backward(const at::Tensor& grad_out, const OptTensor& x, at::IntArrayRef grid,
                                at::ArrayRef<double> axis_scale, const OptTensor& coords, double theta) {
  if (x) {
    check_ltx_rope_angles_args(*x, grid, axis_scale, coords, theta);
    check_grad(grad_out, "grad_out", *x, x->scalar_type());
  } else {
    check_ltx_rope_angles_args(grad_out.contiguous(), grid, axis_scale, coords, theta);
  }
  const at::Tensor gx = rotate_back(grad_out, grid, axis_scale, coords, theta);
  if (!x || !coords) return {gx, none_grad(coords ? *coords : grad_out)};
  // The outputs in fp32: d out / d angle is read off them.
  const at::Tensor out = call_ltx_rope_angles(f32(*x), grid, axis_scale, coords, theta);
  return {gx, coords_grad({{grad_out, out}}, axis_scale, *coords, theta)};
}

Grads2 call_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& x, const OptTensor& weight, double eps) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(LTX_KERNELS_OPS_NAMESPACE_STR "::rms_norm_backward", "")
                             .typed<Grads2(const at::Tensor&, const at::Tensor&, const OptTensor&, double, double,
                                           std::optional<at::ScalarType>)>();
  return op.call(grad_out, x, weight, eps, 0.0, std::nullopt);
}

// out = rope(rms_norm(x) * weight) for q and k: the rotation's adjoint, then the norm's
// backward (norm_backward.cpp's rms_norm_backward).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> ltx_qk_norm_rope_backward(
    const at::Tensor& grad_q_out, const at::Tensor& grad_k_out, const at::Tensor& q, const at::Tensor& k,
    const OptTensor& weight_q, const OptTensor& weight_k, double eps, at::IntArrayRef grid,
    at::ArrayRef<double> axis_scale, const OptTensor& coords, double theta) {
  check_ltx_qk_norm_rope_args(q, k, weight_q, weight_k, eps, grid, axis_scale, coords, theta);
  check_grad(grad_q_out, "grad_q_out", q, q.scalar_type());
  check_grad(grad_k_out, "grad_k_out", k, k.scalar_type());
  const auto [gq, gwq] =
      call_rms_norm_backward(rotate_back(grad_q_out, grid, axis_scale, coords, theta), q, weight_q, eps);
  const auto [gk, gwk] =
      call_rms_norm_backward(rotate_back(grad_k_out, grid, axis_scale, coords, theta), k, weight_k, eps);
  at::Tensor gcoords = none_grad(q);
  if (coords) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(LTX_KERNELS_OPS_NAMESPACE_STR "::ltx_qk_norm_rope", "")
                               .typed<Grads2(const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
                                             double, at::IntArrayRef, at::ArrayRef<double>, const OptTensor&, double)>();
    const auto as_f32 = [](const OptTensor& w) { return w ? OptTensor(f32(*w)) : std::nullopt; };
    const auto [q_out, k_out] =
        op.call(f32(q), f32(k), as_f32(weight_q), as_f32(weight_k), eps, grid, axis_scale, coords, theta);
    gcoords = coords_grad({{grad_q_out, q_out}, {grad_k_out, k_out}}, axis_scale, *coords, theta);
  }
  return {gq, gk, weight_q ? gwq : none_grad(q), weight_k ? gwk : none_grad(k), gcoords};
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  LTX_KERNELS_IMPL(m, "apply_rotary_pos_emb_backward", apply_rotary_pos_emb_backward);
  LTX_KERNELS_IMPL(m, "ltx_rope_backward", ltx_rope_backward);
  LTX_KERNELS_IMPL(m, "ltx_rope_angles_backward", ltx_rope_angles_backward);
  LTX_KERNELS_IMPL(m, "ltx_qk_norm_rope_backward", ltx_qk_norm_rope_backward);
}

}  // namespace ltx_kernels::torch_ext

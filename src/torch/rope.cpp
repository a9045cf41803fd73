// torch bindings of the RoPE family: apply_rotary_pos_emb (tables from the model), ltx_rope
// (diffusers' LTX tables), ltx_rope_angles and ltx_qk_norm_rope (angles in the kernel).
#include "torch/registration.h"

#include "ltx_kernels/rope.h"
#include "torch/common.h"

namespace ltx_kernels::torch_ext {
namespace {

using OptTensor = std::optional<at::Tensor>;

// ---- apply_rotary_pos_emb / ltx_rope: rotation by cos/sin tables ----

// cos or sin for q (called q_name in the messages: q, or x for ltx_rope).
void check_table(const at::Tensor& t, const char* name, const at::Tensor& q, const char* q_name,
                 const c10::SymInt& batches,
                 const c10::SymInt& tokens, const c10::SymInt& head_dim) {
  TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type() || t.scalar_type() == at::kFloat, name,
                   " must have the dtype of ", q_name, " (", q.scalar_type(), ") or float32, got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == q.device(), name, " must be on the device of ", q_name, " (",
                    device_str(q.device()), "), got ", device_str(t.device()));
  const auto expected = [&] {
    return std::string(name) + " must have shape [S, R] or [B or 1, S, R] with S = " +
           dims_str(c10::SymIntArrayRef(&tokens, 1)) + " tokens and R <= head_dim " +
           dims_str(c10::SymIntArrayRef(&head_dim, 1)) + ", got " + dims_str(t.sym_sizes());
  };
  TORCH_CHECK_VALUE(t.dim() == 2 || t.dim() == 3, expected());
  TORCH_CHECK_VALUE(t.sym_size(-2) == tokens && t.sym_size(-1) <= head_dim, expected());
  TORCH_CHECK_VALUE(t.dim() == 2 || t.sym_size(0) == 1 || t.sym_size(0) == batches, expected());
  TORCH_CHECK_VALUE(t.sym_size(-1) <= 1 || t.sym_stride(-1) == 1, name,
                    " must have a contiguous last dim, got strides ", dims_str(t.sym_strides()));
}

// Rotary dims split into half-split sections (one section of R channels by default).
std::array<int64_t, 3> rope_sections(const at::OptionalIntArrayRef& sections, int64_t rotary,
                                     bool interleaved) {
  TORCH_CHECK_VALUE(rotary % 2 == 0, "cos must have an even last dim (rotary dims), got ",
                    std::to_string(rotary));
  std::array<int64_t, 3> out = {rotary, 0, 0};
  if (!sections) return out;
  TORCH_CHECK_VALUE(!interleaved, "sections apply to half-split rotation, not interleaved");
  TORCH_CHECK_VALUE(!sections->empty() && sections->size() <= 3,
                    "sections must have 1 to 3 entries, got ", std::to_string(sections->size()));
  int64_t sum = 0;
  out = {0, 0, 0};
  for (size_t i = 0; i < sections->size(); ++i) {
    const int64_t s = (*sections)[i];
    TORCH_CHECK_VALUE(s >= 0 && s % 2 == 0, "sections must be even and >= 0, got ",
                      std::to_string(s));
    out[i] = s;
    sum += s;
  }
  TORCH_CHECK_VALUE(sum == rotary, "sections must add up to the last dim of cos (",
                    std::to_string(rotary), "), got ", std::to_string(sum));
  return out;
}

struct QkLayout {
  int64_t seq_dim, head_dim_index;
};

// Checks of apply_rotary_pos_emb shared by the real and Meta implementations.
QkLayout check_apply_rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                            const at::Tensor& sin, int64_t unsqueeze_dim) {
  check_activation(q, "q");
  check_activation(k, "k");
  TORCH_CHECK_VALUE(unsqueeze_dim == 1 || unsqueeze_dim == 2,
                    "unsqueeze_dim must be 1 (q, k are [B, H, S, Dh]) or 2 ([B, S, H, Dh]), got ",
                    std::to_string(unsqueeze_dim));
  TORCH_CHECK_VALUE(q.dim() == 4, "q must be 4-dim ([B, H, S, Dh] or [B, S, H, Dh]), got ",
                    dims_str(q.sym_sizes()));
  TORCH_CHECK_VALUE(k.dim() == 4, "k must be 4-dim like q, got ", dims_str(k.sym_sizes()));
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type(), "k must have the dtype of q");
  TORCH_CHECK_VALUE(k.device() == q.device(), "k must be on the device of q");
  const QkLayout l{unsqueeze_dim == 1 ? 2 : 1, unsqueeze_dim};
  TORCH_CHECK_VALUE(k.sym_size(0) == q.sym_size(0) && k.sym_size(l.seq_dim) == q.sym_size(l.seq_dim) &&
                        k.sym_size(3) == q.sym_size(3),
                    "k must match q in batch, sequence and head_dim (heads may differ): q ",
                    dims_str(q.sym_sizes()), ", k ", dims_str(k.sym_sizes()));
  check_table(cos, "cos", q, "q", q.sym_size(0), q.sym_size(l.seq_dim), q.sym_size(3));
  check_table(sin, "sin", q, "q", q.sym_size(0), q.sym_size(l.seq_dim), q.sym_size(3));
  TORCH_CHECK_TYPE(sin.scalar_type() == cos.scalar_type(), "sin must have the dtype of cos");
  TORCH_CHECK_VALUE(sin.sym_sizes() == cos.sym_sizes(), "sin must have the shape of cos ",
                    dims_str(cos.sym_sizes()), ", got ", dims_str(sin.sym_sizes()));
  return l;
}

void set_table(RopeParams& p, const at::Tensor& cos, const at::Tensor& sin) {
  p.table_dtype = to_dtype(cos.scalar_type());
  p.cos = cos.const_data_ptr();
  p.sin = sin.const_data_ptr();
  const bool batched = cos.dim() == 3 && cos.size(0) > 1;
  p.table_batch_stride = batched ? cos.stride(0) : 0;
  p.table_token_stride = cos.stride(-2);
}

// cos and sin with one layout (the kernel indexes both with the same strides).
std::pair<at::Tensor, at::Tensor> same_layout(const at::Tensor& cos, const at::Tensor& sin) {
  if (cos.strides() == sin.strides()) return {cos, sin};
  return {cos.contiguous(), sin.contiguous()};
}

RopeTensor rope_tensor(const at::Tensor& in, at::Tensor& out, const QkLayout& l) {
  RopeTensor t;
  t.in = in.const_data_ptr();
  t.out = out.mutable_data_ptr();
  t.heads = in.size(l.head_dim_index);
  const int64_t dims[3] = {0, l.seq_dim, l.head_dim_index};
  for (int d = 0; d < 3; ++d) {
    t.in_strides[d] = in.stride(dims[d]);
    t.out_strides[d] = out.stride(dims[d]);
  }
  return t;
}

std::tuple<at::Tensor, at::Tensor> apply_rotary_pos_emb(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& cos_in,
                                                        const at::Tensor& sin_in, bool interleaved,
                                                        int64_t unsqueeze_dim,
                                                        at::OptionalIntArrayRef sections) {
  const QkLayout l = check_apply_rotary(q, k, cos_in, sin_in, unsqueeze_dim);
  const auto secs = rope_sections(sections, cos_in.size(-1), interleaved);
  at::Tensor q_out = at::empty(q.sizes(), q.options());
  at::Tensor k_out = at::empty(k.sizes(), k.options());
  if (q.numel() == 0 && k.numel() == 0) return {q_out, k_out};
  const auto [cos, sin] = same_layout(cos_in, sin_in);
  RopeParams p;
  p.dtype = to_dtype(q.scalar_type());
  p.batches = q.size(0);
  p.tokens = q.size(l.seq_dim);
  p.head_dim = q.size(3);
  p.interleaved = interleaved;
  for (int i = 0; i < 3; ++i) p.sections[i] = secs[i];
  set_table(p, cos, sin);
  // Tensors with no heads are skipped (k is optional to the kernel, q is not).
  const bool q_empty = q.numel() == 0;
  if (!q_empty) p.q = rope_tensor(q, q_out, l);
  if (k.numel() > 0) (q_empty ? p.q : p.k) = rope_tensor(k, k_out, l);
  run(p, q, "apply_rotary_pos_emb");
  return {q_out, k_out};
}

std::tuple<at::Tensor, at::Tensor> apply_rotary_pos_emb_meta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    bool interleaved, int64_t unsqueeze_dim, at::OptionalIntArrayRef sections) {
  check_apply_rotary(q, k, cos, sin, unsqueeze_dim);
  rope_sections(sections, cos.sym_size(-1).guard_int(__FILE__, __LINE__), interleaved);
  return {at::empty_symint(q.sym_sizes(), q.options()), at::empty_symint(k.sym_sizes(), k.options())};
}

void check_ltx_x(const at::Tensor& x, const char* name) {
  check_activation(x, name);
  TORCH_CHECK_VALUE(x.dim() == 3, name, " must be [B, S, D] (all heads at once), got ",
                    dims_str(x.sym_sizes()));
}

void check_ltx_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_ltx_x(x, "x");
  TORCH_CHECK_VALUE(x.sym_size(-1) % 2 == 0, "x must have an even last dim (pairs), got ",
                    dims_str(x.sym_sizes()));
  check_table(cos, "cos", x, "x", x.sym_size(0), x.sym_size(1), x.sym_size(2));
  check_table(sin, "sin", x, "x", x.sym_size(0), x.sym_size(1), x.sym_size(2));
  TORCH_CHECK_VALUE(cos.sym_size(-1) == x.sym_size(-1) && sin.sym_sizes() == cos.sym_sizes(),
                    "cos and sin must cover every channel of x: [B or 1, S, D] = ",
                    dims_str(x.sym_sizes()), ", got ", dims_str(cos.sym_sizes()), " and ",
                    dims_str(sin.sym_sizes()));
  TORCH_CHECK_TYPE(sin.scalar_type() == cos.scalar_type(), "sin must have the dtype of cos");
}

// diffusers' apply_rotary_emb: interleaved pairs, per-channel cos/sin (its fp32 tables).
at::Tensor ltx_rope(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in) {
  check_ltx_rope(x, cos_in, sin_in);
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return out;
  const auto [cos, sin] = same_layout(cos_in, sin_in);
  RopeParams p;
  p.dtype = to_dtype(x.scalar_type());
  p.batches = x.size(0);
  p.tokens = x.size(1);
  p.head_dim = x.size(2);
  p.interleaved = true;
  p.sections[0] = x.size(2);
  set_table(p, cos, sin);
  p.q.in = x.const_data_ptr();
  p.q.out = out.mutable_data_ptr();
  p.q.heads = 1;
  p.q.in_strides[0] = x.stride(0);
  p.q.in_strides[1] = x.stride(1);
  p.q.out_strides[0] = out.stride(0);
  p.q.out_strides[1] = out.stride(1);
  run(p, x, "ltx_rope");
  return out;
}

at::Tensor ltx_rope_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_ltx_rope(x, cos, sin);
  return at::empty_symint(x.sym_sizes(), x.options());
}

// ---- ltx_rope_angles / ltx_qk_norm_rope: angles computed in the kernel ----

// The positions of x's tokens (called x_name in the messages: x, or q for ltx_qk_norm_rope).
void check_positions(const at::Tensor& x, const char* x_name, at::IntArrayRef grid,
                     at::ArrayRef<double> axis_scale, const OptTensor& coords, double theta) {
  TORCH_CHECK_VALUE(grid.size() == 3, "grid must be (num_frames, height, width)");
  TORCH_CHECK_VALUE(axis_scale.size() == 3, "axis_scale must have 3 entries (frames, height, width)");
  TORCH_CHECK_VALUE(theta > 0.0, "theta must be > 0, got ", std::to_string(theta));
  if (coords) {
    TORCH_CHECK_TYPE(at::isFloatingType(coords->scalar_type()), "video_coords must be floating point, got ",
                     coords->scalar_type());
    TORCH_CHECK_VALUE(coords->device() == x.device(), "video_coords must be on the device of ", x_name, " (",
                      device_str(x.device()), "), got ", device_str(coords->device()));
    TORCH_CHECK_VALUE(coords->dim() == 3 && coords->sym_size(0) == x.sym_size(0) &&
                          coords->sym_size(1) == 3 && coords->sym_size(2) == x.sym_size(1),
                      "video_coords must be [B, 3, S] for ", x_name, " ", dims_str(x.sym_sizes()), ", got ",
                      dims_str(coords->sym_sizes()));
    return;
  }
  for (int64_t g : grid)
    TORCH_CHECK_VALUE(g >= 1, "grid sizes (num_frames, height, width) must be >= 1, got ",
                      std::to_string(grid[0]), "x", std::to_string(grid[1]), "x", std::to_string(grid[2]));
  TORCH_CHECK_VALUE(x.sym_size(1) == grid[0] * grid[1] * grid[2], x_name,
                    " must have num_frames * height * width = ", std::to_string(grid[0] * grid[1] * grid[2]),
                    " tokens, got ", x_name, " ", dims_str(x.sym_sizes()));
}

LtxRopeParams ltx_params(const Rows& q, at::Tensor& q_out, at::IntArrayRef grid,
                         at::ArrayRef<double> axis_scale, const OptTensor& coords, double theta,
                         at::Tensor& coords_keep, int64_t batches) {
  LtxRopeParams p;
  p.dtype = to_dtype(q.tensor.scalar_type());
  p.batches = batches;
  p.tokens = q.rows / batches;
  p.cols = q.cols;
  p.q = q.tensor.const_data_ptr();
  p.q_row_stride = q.row_stride;
  p.q_out = q_out.mutable_data_ptr();
  for (int i = 0; i < 3; ++i) {
    p.grid[i] = grid[i];
    p.axis_scale[i] = axis_scale[i];
  }
  p.theta = theta;
  if (coords) {
    // Positions are read as fp32: an explicit (tiny) conversion of other float dtypes.
    coords_keep = coords->to(at::kFloat);
    p.coords = coords_keep.const_data_ptr<float>();
    for (int i = 0; i < 3; ++i) p.coords_strides[i] = coords_keep.stride(i);
  }
  return p;
}

at::Tensor ltx_rope_angles(const at::Tensor& x, at::IntArrayRef grid,
                           at::ArrayRef<double> axis_scale, const OptTensor& coords,
                           double theta) {
  check_ltx_x(x, "x");
  check_positions(x, "x", grid, axis_scale, coords, theta);
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return out;
  const Rows rows = as_rows(x);
  at::Tensor keep;
  const LtxRopeParams p = ltx_params(rows, out, grid, axis_scale, coords, theta, keep, x.size(0));
  run(p, x, "ltx_rope_angles");
  return out;
}

at::Tensor ltx_rope_angles_meta(const at::Tensor& x, at::IntArrayRef grid,
                                at::ArrayRef<double> axis_scale, const OptTensor& coords,
                                double theta) {
  check_ltx_x(x, "x");
  check_positions(x, "x", grid, axis_scale, coords, theta);
  return at::empty_symint(x.sym_sizes(), x.options());
}

std::pair<OptTensor, OptTensor> check_qk_norm_rope(const at::Tensor& q, const at::Tensor& k,
                                                   const OptTensor& weight_q,
                                                   const OptTensor& weight_k, double eps) {
  check_ltx_x(q, "q");
  check_like(k, "k", q, "q");
  constexpr const char* op = "ltx_qk_norm_rope";
  TORCH_CHECK_VALUE(eps >= 0.0, op, ": eps must be >= 0, got ", std::to_string(eps));
  return {channel_vector(weight_q, "weight_q", q, "q"), channel_vector(weight_k, "weight_k", k, "k")};
}

std::tuple<at::Tensor, at::Tensor> ltx_qk_norm_rope(const at::Tensor& q, const at::Tensor& k,
                                                    const OptTensor& weight_q,
                                                    const OptTensor& weight_k, double eps,
                                                    at::IntArrayRef grid,
                                                    at::ArrayRef<double> axis_scale,
                                                    const OptTensor& coords, double theta) {
  const auto [wq, wk] = check_qk_norm_rope(q, k, weight_q, weight_k, eps);
  check_positions(q, "q", grid, axis_scale, coords, theta);
  at::Tensor q_out = at::empty(q.sizes(), q.options());
  at::Tensor k_out = at::empty(k.sizes(), k.options());
  if (q.numel() == 0) return {q_out, k_out};
  const Rows q_rows = as_rows(q);
  const Rows k_rows = as_rows(k);
  at::Tensor keep;
  LtxRopeParams p = ltx_params(q_rows, q_out, grid, axis_scale, coords, theta, keep, q.size(0));
  p.k = k_rows.tensor.const_data_ptr();
  p.k_row_stride = k_rows.row_stride;
  p.k_out = k_out.mutable_data_ptr();
  p.norm = true;
  p.eps = static_cast<float>(eps);
  p.q_weight = data_or_null(wq);
  p.k_weight = data_or_null(wk);
  run(p, q, "ltx_qk_norm_rope");
  return {q_out, k_out};
}

std::tuple<at::Tensor, at::Tensor> ltx_qk_norm_rope_meta(
    const at::Tensor& q, const at::Tensor& k, const OptTensor& weight_q, const OptTensor& weight_k,
    double eps, at::IntArrayRef grid, at::ArrayRef<double> axis_scale, const OptTensor& coords,
    double theta) {
  check_qk_norm_rope(q, k, weight_q, weight_k, eps);
  check_positions(q, "q", grid, axis_scale, coords, theta);
  return {at::empty_symint(q.sym_sizes(), q.options()), at::empty_symint(k.sym_sizes(), k.options())};
}

void register_impls(torch::Library& m) {
  LTX_KERNELS_IMPL(m, "apply_rotary_pos_emb", apply_rotary_pos_emb);
  LTX_KERNELS_IMPL(m, "ltx_rope", ltx_rope);
  LTX_KERNELS_IMPL(m, "ltx_rope_angles", ltx_rope_angles);
  LTX_KERNELS_IMPL(m, "ltx_qk_norm_rope", ltx_qk_norm_rope);
}

}  // namespace

// The forward ops' checks, for their backward ops (op_checks.h).
void check_rope_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                     bool interleaved, int64_t unsqueeze_dim, at::OptionalIntArrayRef sections) {
  check_apply_rotary(q, k, cos, sin, unsqueeze_dim);
  rope_sections(sections, cos.sym_size(-1).guard_int(__FILE__, __LINE__), interleaved);
}

void check_ltx_rope_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_ltx_rope(x, cos, sin);
}

void check_ltx_rope_angles_args(const at::Tensor& x, at::IntArrayRef grid, at::ArrayRef<double> axis_scale,
                                const OptTensor& coords, double theta) {
  check_ltx_x(x, "x");
  check_positions(x, "x", grid, axis_scale, coords, theta);
}

void check_ltx_qk_norm_rope_args(const at::Tensor& q, const at::Tensor& k, const OptTensor& weight_q,
                                 const OptTensor& weight_k, double eps, at::IntArrayRef grid,
                                 at::ArrayRef<double> axis_scale, const OptTensor& coords, double theta) {
  check_qk_norm_rope(q, k, weight_q, weight_k, eps);
  check_positions(q, "q", grid, axis_scale, coords, theta);
}

LTX_KERNELS_LIBRARY_IMPL(CPU, m) { register_impls(m); }

#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) { register_impls(m); }
#endif

LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  LTX_KERNELS_IMPL(m, "apply_rotary_pos_emb", apply_rotary_pos_emb_meta);
  LTX_KERNELS_IMPL(m, "ltx_rope", ltx_rope_meta);
  LTX_KERNELS_IMPL(m, "ltx_rope_angles", ltx_rope_angles_meta);
  LTX_KERNELS_IMPL(m, "ltx_qk_norm_rope", ltx_qk_norm_rope_meta);
}

}  // namespace ltx_kernels::torch_ext

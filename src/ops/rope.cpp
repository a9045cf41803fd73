// Host-side logic of the RoPE family: argument validation and the vector width.
#include "ltx_kernels/rope.h"
#include "ops/host_util.h"

namespace ltx_kernels {

namespace {

ValidationError validate_tensor(const RopeTensor& t, bool optional) {
  if (t.in == nullptr) return optional ? nullptr : "q is null";
  if (t.out == nullptr) return "output is null";
  if (t.heads < 1) return "heads must be >= 1";
  for (int d = 0; d < 3; ++d)
    if (t.in_strides[d] < 0 || t.out_strides[d] < 0) return "strides must be >= 0";
  return nullptr;
}

bool vector_ok(const RopeTensor& t, int vec) {
  if (t.in == nullptr) return true;
  for (int d = 0; d < 3; ++d)
    if (t.in_strides[d] % vec != 0 || t.out_strides[d] % vec != 0) return false;
  return host_util::aligned16(t.in) && host_util::aligned16(t.out);
}

}  // namespace

ValidationError validate(const RopeParams& p) {
  if (p.batches < 0 || p.tokens < 0) return "batches and tokens must be >= 0";
  if (p.head_dim < 1) return "head_dim must be >= 1";
  if (p.table_dtype != p.dtype && p.table_dtype != DType::kFloat32)
    return "cos and sin must have the dtype of q or float32";
  for (int64_t s : p.sections)
    if (s < 0 || s % 2 != 0) return "rotary sections must be even and >= 0";
  const int64_t rot = rotary_dims(p);
  if (rot > p.head_dim) return "rotary dims exceed head_dim";
  if (p.table_batch_stride < 0 || p.table_token_stride < 0) return "table strides must be >= 0";
  if (p.batches == 0 || p.tokens == 0) return nullptr;
  if (ValidationError e = validate_tensor(p.q, false)) return e;
  if (ValidationError e = validate_tensor(p.k, true)) return e;
  if (rot > 0 && (p.cos == nullptr || p.sin == nullptr)) return "cos and sin are null";
  return nullptr;
}

int rope_vector(const RopeParams& p) {
  const int vec = 16 / dtype_size(p.dtype);
  const int64_t rot = rotary_dims(p);
  bool ok = (p.head_dim - rot) % vec == 0 && vector_ok(p.q, vec) && vector_ok(p.k, vec);
  // Every vector lies in one half of one section (half-split) or holds whole pairs.
  for (int64_t s : p.sections) ok = ok && (p.interleaved ? s % vec == 0 : (s / 2) % vec == 0);
  // Tables are read with the same element offsets, up to 16 bytes per access.
  const int table_vec = vec < 16 / dtype_size(p.table_dtype) ? vec : 16 / dtype_size(p.table_dtype);
  ok = ok && (rot == 0 || (host_util::aligned16(p.cos) && host_util::aligned16(p.sin) &&
                           p.table_batch_stride % table_vec == 0 &&
                           p.table_token_stride % table_vec == 0));
  return ok ? vec : 1;
}

ValidationError validate(const LtxRopeParams& p) {
  if (p.batches < 0 || p.tokens < 0) return "batches and tokens must be >= 0";
  if (p.cols < 1) return "cols must be >= 1";
  if (p.cols > INT32_MAX) return "cols must be < 2^31";
  if (!(p.eps >= 0.0f)) return "eps must be >= 0";
  if (!(p.theta > 0.0)) return "theta must be > 0";
  if (!p.norm && (p.q_weight != nullptr || p.k_weight != nullptr))
    return "norm weights need norm";
  if ((p.k == nullptr) != (p.k_out == nullptr)) return "k and k_out must be given together";
  if (p.coords == nullptr) {
    for (int64_t g : p.grid)
      if (g < 1) return "grid sizes must be >= 1";
    if (p.grid[0] * p.grid[1] * p.grid[2] != p.tokens) return "grid must hold exactly tokens points";
  }
  if (p.batches == 0 || p.tokens == 0) return nullptr;
  if (p.q == nullptr || p.q_out == nullptr) return "q is null";
  if (p.q_row_stride < 0 || p.k_row_stride < 0) return "row strides must be >= 0";
  return nullptr;
}

}  // namespace ltx_kernels

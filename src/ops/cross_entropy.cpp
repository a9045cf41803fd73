// Host-side logic of the cross-entropy row passes: argument validation and the vector width.
#include "ltx_kernels/cross_entropy.h"

namespace ltx_kernels {
namespace {

ValidationError validate_chunk(const CrossEntropyChunk& c) {
  if (c.rows < 0) return "rows must be >= 0";
  if (c.cols < 0) return "cols must be >= 0";
  if (c.rows == 0 || c.cols == 0) return nullptr;
  if (c.logits == nullptr) return "logits is null";
  if (c.target == nullptr) return "target is null";
  if (c.logits_row_stride < c.cols && c.rows > 1) return "logits rows overlap (logits_row_stride < cols)";
  if (c.class0 < 0) return "class0 must be >= 0";
  return nullptr;
}

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// 4-element vectors of the logits (16 bytes) and of the bias.
bool chunk_vectorizes(const CrossEntropyChunk& c) {
  return c.cols % 4 == 0 && c.logits_row_stride % 4 == 0 && aligned(c.logits, 16) &&
         aligned(c.bias, 4 * dtype_size(c.bias_dtype));
}

}  // namespace

ValidationError validate(const CrossEntropyStatsParams& p) {
  if (ValidationError error = validate_chunk(p.chunk)) return error;
  if (p.chunk.rows == 0) return nullptr;
  if (p.row_max == nullptr || p.row_sum == nullptr || p.picked == nullptr) return "row_max, row_sum and picked are required";
  return nullptr;
}

ValidationError validate(const CrossEntropyGradParams& p) {
  if (ValidationError error = validate_chunk(p.chunk)) return error;
  if (p.chunk.rows == 0 || p.chunk.cols == 0) return nullptr;
  if (p.lse == nullptr || p.softmax_weight == nullptr || p.target_weight == nullptr)
    return "lse, softmax_weight and target_weight are required";
  if (p.grad == nullptr) return "grad is null";
  if (p.grad_row_stride < p.chunk.cols && p.chunk.rows > 1) return "grad rows overlap (grad_row_stride < cols)";
  return nullptr;
}

int cross_entropy_vector(const CrossEntropyStatsParams& p) { return chunk_vectorizes(p.chunk) ? 4 : 1; }

int cross_entropy_vector(const CrossEntropyGradParams& p) {
  const bool ok = chunk_vectorizes(p.chunk) && p.grad_row_stride % 4 == 0 && aligned(p.grad, 4 * dtype_size(p.grad_dtype));
  return ok ? 4 : 1;
}

}  // namespace ltx_kernels

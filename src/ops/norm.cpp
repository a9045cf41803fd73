// Host-side logic of the norm family: argument validation and launch planning.
// Plain C++ so it is unit-tested without a GPU.
#include <algorithm>
#include <cstdint>

#include "ltx_kernels/norm.h"

namespace ltx_kernels {

ValidationError validate(const NormParams& p) {
  if (p.rows < 0) return "rows must be >= 0";
  if (p.cols < 1) return "cols must be >= 1";
  if (!(p.eps >= 0.0f)) return "eps must be >= 0";
  if ((p.residual == nullptr) != (p.residual_out == nullptr))
    return "residual and residual_out must be given together";
  if (p.bias != nullptr && p.type != NormType::kLayer) return "bias is only defined for layer norm";
  if (p.rows == 0) return nullptr;
  if (p.x == nullptr) return "x is null";
  if (p.out == nullptr) return "out is null";
  if (p.x_row_stride < 0 || p.residual_row_stride < 0) return "input row strides must be >= 0";
  if (p.out_row_stride < p.cols) return "out rows overlap (out_row_stride < cols)";
  if (p.residual_out != nullptr && p.residual_out_row_stride < p.cols)
    return "residual_out rows overlap (residual_out_row_stride < cols)";
  return nullptr;
}

namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

NormLaunchPlan plan_norm(const NormParams& p) {
  NormLaunchPlan plan;
  const int vec = 16 / dtype_size(p.dtype);
  // 16-byte accesses need every pointer and every row start 16-byte aligned.
  const bool can_vectorize =
      p.cols % vec == 0 && p.x_row_stride % vec == 0 && p.out_row_stride % vec == 0 &&
      aligned16(p.x) && aligned16(p.out) && aligned16(p.weight) && aligned16(p.bias) &&
      aligned16(p.residual) && aligned16(p.residual_out) && p.residual_row_stride % vec == 0 &&
      p.residual_out_row_stride % vec == 0;
  plan.vec = can_vectorize ? vec : 1;
  const int64_t nvec = p.cols / plan.vec;

  // One vector per thread while a row fits in 256 threads, then 2, 4 or 8 vectors per
  // thread (kernels with fewer registers keep more blocks resident); rows beyond that are
  // streamed by 1024 threads.
  plan.threads_per_row = static_cast<int>(std::min<int64_t>(ceil_div(nvec, 32) * 32, kMaxCachedThreads));
  const int64_t need = ceil_div(nvec, plan.threads_per_row);
  int items = 1;
  while (items < need) items *= 2;
  plan.items = items <= kMaxItems ? items : 0;
  if (plan.items == 0) plan.threads_per_row = kMaxStreamedThreads;

  // Short rows share a block so a block still has 256 threads to hide latency with.
  plan.rows_per_block = plan.threads_per_row >= kMaxCachedThreads ? 1 : kMaxCachedThreads / plan.threads_per_row;
  plan.blocks = ceil_div(p.rows, plan.rows_per_block);
  return plan;
}

}  // namespace ltx_kernels

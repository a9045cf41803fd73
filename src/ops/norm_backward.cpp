// Host-side logic of the fused norm backward: argument validation and the launch plan.
#include "ops/norm_backward_plan.h"

#include "ops/host_util.h"

namespace ltx_kernels {

ValidationError validate(const NormBackwardParams& p) {
  if (p.type != NormType::kRms && p.type != NormType::kLayer) return "unknown norm type";
  if (p.rows < 0) return "rows must be >= 0";
  if (p.cols < 0) return "cols must be >= 0";
  if (!(p.eps >= 0.0f)) return "eps must be >= 0";
  if (p.grad_new_residual != nullptr && p.type != NormType::kRms)
    return "grad_new_residual is only defined for the RMS norm";
  if (p.dbias_partial != nullptr && p.type != NormType::kLayer) return "a bias is only defined for layer norm";
  if ((p.weight == nullptr) != (p.dweight_partial == nullptr) || (p.weight == nullptr) != (p.dweight == nullptr))
    return "weight, dweight_partial and dweight go together";
  if ((p.dbias_partial == nullptr) != (p.dbias == nullptr)) return "dbias_partial and dbias go together";
  if (p.weight_dtype != p.dtype && p.weight_dtype != DType::kFloat32)
    return "weight_dtype must be dtype or float32";
  if (p.rows == 0 || p.cols == 0) return nullptr;
  if (p.x == nullptr) return "x is null";
  if (p.grad_out == nullptr) return "grad_out is null";
  if (p.out == nullptr) return "out is null";
  if (p.blocks < 1) return "blocks must be >= 1";
  if (p.x_row_stride < 0 || p.grad_out_row_stride < 0 ||
      p.grad_new_residual_row_stride < 0)
    return "input row strides must be >= 0";
  if (p.rows > 1 && p.out_row_stride < p.cols) return "out rows overlap (out_row_stride < cols)";
  return nullptr;
}

NormBackwardPlan plan_norm_backward(const NormBackwardParams& p) {
  using host_util::aligned16;
  const int vec = 16 / dtype_size(p.dtype);
  const bool aligned = p.cols % vec == 0 && p.x_row_stride % vec == 0 &&
                       p.grad_out_row_stride % vec == 0 && p.grad_new_residual_row_stride % vec == 0 &&
                       p.out_row_stride % vec == 0 && aligned16(p.x) && aligned16(p.grad_out) &&
                       aligned16(p.grad_new_residual) && aligned16(p.out) && aligned16(p.weight);
  NormBackwardPlan plan;
  plan.vec = aligned ? vec : 1;
  const int64_t vectors = (p.cols + plan.vec - 1) / plan.vec;
  // A warp a row while a row is at most 2 vectors a thread (small D: many rows per block),
  // else the block's 256 threads a row with up to 8 vectors each.
  if (vectors <= 2 * 32) {
    plan.threads_per_row = 32;
    plan.items = vectors <= 32 ? 1 : 2;
    return plan;
  }
  plan.threads_per_row = kNormBackwardThreads;
  for (int items = 1; items <= kNormBackwardMaxItems; items *= 2) {
    if (vectors <= int64_t{items} * kNormBackwardThreads) {
      plan.items = items;
      return plan;
    }
  }
  plan.items = 0;  // too long
  return plan;
}

bool norm_backward_supported(const NormBackwardParams& p) { return plan_norm_backward(p).items > 0; }

}  // namespace ltx_kernels

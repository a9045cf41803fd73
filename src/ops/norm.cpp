// Host-side logic of the norm family: argument validation and launch planning.
// Plain C++ so it is unit-tested without a GPU.
#include <algorithm>
#include <cstdint>

#include "ltx_kernels/norm.h"
#include "ops/host_util.h"

namespace ltx_kernels {

ValidationError validate(const NormParams& p) {
  if (p.rows < 0) return "rows must be >= 0";
  if (p.cols < 1) return "cols must be >= 1";
  if (!(p.eps >= 0.0f)) return "eps must be >= 0";
  if ((p.residual == nullptr) != (p.new_residual == nullptr))
    return "residual and new_residual must be given together";
  if (p.bias != nullptr && p.type != NormType::kLayer) return "bias is only defined for layer norm";
  // (the kernels add a residual to the RMS norm's input only)
  if (p.residual != nullptr && p.type != NormType::kRms) return "residual is only defined for the RMS norm";
  if (p.gate.ptr != nullptr && p.residual == nullptr) return "gate needs a residual";
  if ((p.scale.ptr == nullptr) != (p.shift.ptr == nullptr))
    return "scale and shift must be given together";
  if (p.tokens < 1) return "tokens must be >= 1";
  if (p.rows % p.tokens != 0) return "rows must be a multiple of tokens";
  for (DType t : {p.weight_dtype, p.out_dtype})
    if (t != p.dtype && t != DType::kFloat32) return "weight_dtype and out_dtype must be dtype or float32";
  const bool mixed = p.weight_dtype != p.dtype || p.out_dtype != p.dtype;
  if (p.out_dtype != p.weight_dtype && p.out_dtype != p.dtype) return "a float32 out_dtype needs a float32 weight_dtype";
  if (mixed && (p.scale.ptr != nullptr || p.out_fp8 != nullptr))
    return "weight_dtype and out_dtype must be dtype with scale / shift or an FP8 output";
  for (const RowVectors* v : {&p.gate, &p.scale, &p.shift})
    if (v->batch_stride < 0 || v->token_stride < 0) return "row vector strides must be >= 0";
  if (p.rows == 0) return nullptr;
  if (p.x == nullptr) return "x is null";
  if (p.out == nullptr && p.out_fp8 == nullptr) return "out is null";
  if ((p.out_fp8 == nullptr) != (p.out_fp8_scale == nullptr))
    return "out_fp8 and out_fp8_scale must be given together";
  if (p.x_row_stride < 0 || p.residual_row_stride < 0) return "input row strides must be >= 0";
  if (p.out != nullptr && p.out_row_stride < p.cols) return "out rows overlap (out_row_stride < cols)";
  if (p.out == nullptr && p.out_row_stride != 0) return "out_row_stride must be 0 without out";
  if (p.out_fp8 != nullptr && p.out_fp8_row_stride < p.cols)
    return "out_fp8 rows overlap (out_fp8_row_stride < cols)";
  if (p.new_residual != nullptr && p.new_residual_row_stride < p.cols)
    return "new_residual rows overlap (new_residual_row_stride < cols)";
  return nullptr;
}

using host_util::aligned16;
using host_util::aligned_vectors;
using host_util::ceil_div;

NormLaunchPlan plan_norm(const NormParams& p) {
  NormLaunchPlan plan;
  const int vec = 16 / dtype_size(p.dtype);
  // 16-byte accesses need every pointer and every row start 16-byte aligned; the FP8 output
  // is written vec bytes at a time.
  const bool can_vectorize =
      p.cols % vec == 0 && p.x_row_stride % vec == 0 && p.out_row_stride % vec == 0 &&
      p.out_fp8_row_stride % vec == 0 && reinterpret_cast<uintptr_t>(p.out_fp8) % vec == 0 &&
      aligned16(p.x) && aligned16(p.out) && aligned16(p.weight) && aligned16(p.bias) &&
      aligned16(p.residual) && aligned16(p.new_residual) && p.residual_row_stride % vec == 0 &&
      p.new_residual_row_stride % vec == 0 && aligned_vectors(p.gate, vec) &&
      aligned_vectors(p.scale, vec) && aligned_vectors(p.shift, vec);
  plan.vec = can_vectorize ? vec : 1;
  const int64_t nvec = p.cols / plan.vec;

  // One vector per thread while a row fits in 256 threads, then 2, 4 or 8 vectors per
  // thread (kernels with fewer registers keep more blocks resident); rows beyond that are
  // streamed by 1024 threads. Threads per row are a power of two (the kernels are compiled
  // for each), and short rows share a 256-thread block.
  // The RMS AdaLN forms without a residual (adaln_rms_norm and its FP8 form, which must agree
  // bit for bit: one plan for both) aim at 4 vectors per thread instead: fewer threads per row
  // reduce it more cheaply and hold more bytes in flight each. H100, bf16, LTX's [2, 1, 6, D]
  // modulation: adaln_rms_norm_fp8 88.5 -> 56.6 us at 16128 x 2048 and 31.3 -> 22.5 at 5376 x
  // 2048, adaln_rms_norm 66.8 -> 52.6 / 23.7 -> 19.0; 4096 and 3072 columns likewise
  // (benchmarks/results/h100/norm_threads_per_row.md). The plain RMS norm and the residual
  // forms did not gain at every size, and each must keep the plan of its FP8 form. Layer norms
  // (plain and AdaLN; they take no residual) gain too from 1000 rows on, where every SM has
  // rows to interleave (H100: layer_norm 16128 x 2048 bf16 57.4 -> 52.3 us, adaln_layer_norm
  // 74.9 -> 64.5, its FP8 form 96.7 -> 72.4; 1.00-1.18x at the held-out sizes but 0.95x at
  // 1000 x 1536), and lose below (1-64 rows: 5.7-6.3 -> 7.6-7.8 us), where a row's latency is the
  // call's (benchmarks/results/h100/norm_plans.md).
  // The plain RMS norm (and its FP8 form), vectorized, holds 2 vectors a thread from 1000 rows
  // on: H200, bf16, D = 2048: 38.9 -> 37.5 us at 16128 rows, 16.4 -> 15.4 at 5376 (D = 1536:
  // 33.7 -> 30.5, 14.8 -> 13.4); 4 vectors were no faster at D = 2048, and 3072+ columns already
  // take 2 or more (benchmarks/results/h200/norm_plans.md).
  // The plain layer norm below 1000 rows holds 2 vectors a thread, not 1 (from 1536 to 2048
  // columns; 3072+ take 2 either way): H200 bf16, 2 x 128 against 1 x 256, D = 2048: 4.2 vs 4.7 us
  // at 1 row, 4.6 vs 4.8 at 64; D = 1536: 4.2 vs 4.6, 4.6 vs 4.7. From 1000 rows on 4 still pays
  // at 3072+ columns (4095 x 3072: 4 x 128 21.1 vs 2 x 256 23.3; benchmarks/results/h200/norm_plans.md).
  const bool four_per_thread =
      p.residual == nullptr && ((p.type == NormType::kLayer && p.rows >= 1000) ||
                                (p.type == NormType::kRms && p.scale.ptr != nullptr));
  const bool two_per_thread = plan.vec > 1 && p.residual == nullptr && p.scale.ptr == nullptr &&
                              (p.type == NormType::kRms ? p.rows >= 1000 : p.rows < 1000);
  const int64_t target = four_per_thread ? ceil_div(nvec, 4) : two_per_thread ? ceil_div(nvec, 2) : nvec;
  // Vectorized rows of at most 16 vectors (head_dim 64 / 128 in 16 bits: the QK norms of
  // FLUX, SD3, Qwen3) take 8 or 16 threads, several rows a warp: with 32, three quarters of
  // the threads idled at head_dim 64. H100 bf16 rms_norm (layer_norm): 311296 x 64 (SD3.5-large's
  // image q) 67.5 -> 33.5 us (107.8 -> 35.6), 262144 x 128 (Qwen3 q at 8k tokens) 60.2 -> 51.8
  // (92.3 -> 54.7); benchmarks/results/h100/norm_head_dim.md.
  int64_t threads = plan.vec > 1 && nvec <= 8 ? 8 : plan.vec > 1 && nvec <= 16 ? 16 : 32;
  while (threads < target && threads < kMaxCachedThreads) threads *= 2;
  const int64_t need = ceil_div(nvec, threads);
  int items = 1;
  while (items < need) items *= 2;
  plan.items = items <= kMaxItems ? items : 0;
  plan.threads_per_row = plan.items > 0 ? static_cast<int>(threads) : kMaxStreamedThreads;
  plan.rows_per_block = plan.items > 0 ? kMaxCachedThreads / plan.threads_per_row : 1;
  plan.blocks = ceil_div(p.rows, plan.rows_per_block);
  return plan;
}

}  // namespace ltx_kernels

// fused_linear_cross_entropy: cross_entropy(x @ weight.T + bias, target), the loss of an LLM's
// head, without the [tokens, vocab] logits. Stock transformers materializes them in the
// model's dtype and again in fp32 (for Llama-3-8B at 8192 tokens: 2.1 + 4.2 GB, plus the same
// again for their gradient); here the tokens go through in chunks whose fp32 logits are about
// the size of x, so the head's peak memory is a chunk's, not the vocabulary's times the tokens.
//
// Forward and backward are composites of ATen ops (cuBLAS GEMMs on CUDA, per chunk), the same
// code for CPU and CUDA, with shape-only Meta kernels (what torch.compile traces); the backward recomputes each chunk's logits from x (the op's one
// mechanism: backward ops recompute, nothing but the inputs is saved), so a training step runs
// the head's GEMM four times where stock runs it three: the price of not keeping the logits.
// Numerics: logits and their softmax in fp32 (the GEMM accumulates in fp32 and its output is
// not rounded to x's dtype first, unlike stock), the logits' gradient rounded once to x's dtype
// for the two gradient GEMMs as stock autograd does, the GEMMs' outputs in fp32 (weight and
// bias gradients accumulated over the chunks) and each gradient rounded once.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "torch/backward.h"
#include "torch/common.h"
#include "torch/registration.h"

namespace ltx_kernels::torch_ext {
namespace {

enum class Reduction { kMean, kSum, kNone };

Reduction parse_reduction(const std::string& reduction) {
  if (reduction == "mean") return Reduction::kMean;
  if (reduction == "sum") return Reduction::kSum;
  TORCH_CHECK_VALUE(reduction == "none", "fused_linear_cross_entropy: reduction must be 'mean', 'sum' or 'none', got '",
                    reduction, "'");
  return Reduction::kNone;
}

void check_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target, const OptTensor& bias,
                int64_t ignore_index, bool check_values = true) {
  constexpr const char* kOp = "fused_linear_cross_entropy";
  TORCH_CHECK_TYPE(at::isFloatingType(x.scalar_type()) && x.scalar_type() != at::kDouble,
                   kOp, ": x must be float32, bfloat16 or float16, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() >= 1, kOp, ": x must be [..., hidden], got a 0-d tensor");
  TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type(), kOp, ": weight must have x's dtype ", x.scalar_type(),
                   ", got ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.sym_size(1) == x.sym_size(-1), kOp,
                    ": weight must be [vocab, hidden] with hidden = x's last dim (x ", dims_str(x.sym_sizes()),
                    "), got ", dims_str(weight.sym_sizes()));
  TORCH_CHECK_VALUE(weight.sym_size(0) > 0, kOp, ": weight must have at least one row (the vocabulary)");
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong, kOp, ": target must be int64 class indices, got ",
                   target.scalar_type());
  TORCH_CHECK_VALUE(target.sym_sizes() == x.sym_sizes().slice(0, x.dim() - 1), kOp,
                    ": target must have x's shape without its last dim (x ", dims_str(x.sym_sizes()), "), got ",
                    dims_str(target.sym_sizes()));
  TORCH_CHECK_VALUE(weight.device() == x.device() && target.device() == x.device(), kOp,
                    ": weight and target must be on x's device ", device_str(x.device()), ", got ",
                    device_str(weight.device()), " and ", device_str(target.device()));
  if (bias) {
    TORCH_CHECK_TYPE(bias->scalar_type() == x.scalar_type(), kOp, ": bias must have x's dtype ", x.scalar_type(),
                     ", got ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0), kOp,
                      ": bias must be [vocab] with vocab = weight.size(0) (weight ", dims_str(weight.sym_sizes()),
                      "), got ", dims_str(bias->sym_sizes()));
    TORCH_CHECK_VALUE(bias->device() == x.device(), kOp, ": bias must be on x's device ", device_str(x.device()),
                      ", got ", device_str(bias->device()));
  }
  // A class index outside the vocabulary would read outside a row of logits: one check (a
  // device sync on CUDA) per call, on the backends that hold values.
  if (check_values && target.numel() > 0) {
    const at::Tensor bad = (target != ignore_index).logical_and((target < 0).logical_or(target >= weight.size(0)));
    // Numbers as std::to_string, never streamed (see common.cpp: that crashed on the GPU machine).
    TORCH_CHECK_VALUE(!bad.any().item<bool>(), kOp, ": target holds a class index outside [0, ",
                      std::to_string(weight.size(0)), ") that is not ignore_index (", std::to_string(ignore_index),
                      ")");
  }
}

// Rows per chunk: fp32 logits of about x's size (the vocabulary over the hidden size fewer
// rows than x has), a power of two.
int64_t chunk_rows(int64_t rows, int64_t hidden, int64_t vocab) {
  hidden = std::max<int64_t>(hidden, 1);
  const int64_t factor = std::max<int64_t>(1, (vocab + hidden - 1) / hidden);
  const int64_t want = std::max<int64_t>(1, (rows + factor - 1) / factor);
  int64_t chunk = 1;
  while (chunk < want) chunk *= 2;
  return chunk;
}

// The call as rows: x [rows, hidden], target [rows], and the rows per chunk.
struct Rows {
  Rows(const at::Tensor& x_, const at::Tensor& weight, const at::Tensor& target_)
      : hidden(x_.size(-1)), vocab(weight.size(0)), x(x_.reshape({target_.numel(), hidden})), target(target_.reshape({-1})),
        rows(x.size(0)), chunk(chunk_rows(rows, hidden, vocab)) {}
  int64_t hidden, vocab;
  at::Tensor x, target;
  int64_t rows, chunk;
};

// a @ b in fp32 from 16-bit operands: cuBLAS writes fp32 directly on CUDA; elsewhere upcast.
at::Tensor mm_f32(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kFloat) return at::mm(a, b);
  if (a.is_cuda()) return at::mm(a, b, at::kFloat);
  return at::mm(f32(a), f32(b));
}

// One chunk's fp32 logits [rows, vocab].
at::Tensor chunk_logits(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias) {
  at::Tensor logits = mm_f32(x, weight.t());
  if (bias) logits.add_(f32(*bias));
  return logits;
}

// Per-row losses of one chunk (0 where ignored), and the logits' log-sum-exp.
std::tuple<at::Tensor, at::Tensor> chunk_loss(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& valid) {
  const at::Tensor lse = at::logsumexp(logits, 1);
  const at::Tensor picked = logits.gather(1, target.where(valid, 0).unsqueeze(1)).squeeze(1);
  return {(lse - picked).where(valid, 0.0), lse};
}

at::Tensor fused_linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
                                      const OptTensor& bias, int64_t ignore_index, c10::string_view reduction_name) {
  const Reduction reduction = parse_reduction(std::string(reduction_name));
  check_args(x, weight, target, bias, ignore_index);
  const Rows r(x, weight, target);
  const at::Tensor &x2 = r.x, &t = r.target;
  const int64_t rows = r.rows, chunk = r.chunk;
  at::Tensor losses = at::empty({rows}, x.options().dtype(at::kFloat));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r1 = std::min(rows, r0 + chunk);
    const at::Tensor tc = t.slice(0, r0, r1);
    losses.slice(0, r0, r1).copy_(std::get<0>(chunk_loss(chunk_logits(x2.slice(0, r0, r1), weight, bias), tc,
                                                          tc != ignore_index)));
  }
  if (reduction == Reduction::kNone) return losses.view(target.sizes());
  const at::Tensor total = losses.sum();
  // mean over the targets not ignored, as torch's cross_entropy (0 / 0 = NaN when all are)
  return reduction == Reduction::kSum ? total : total / (t != ignore_index).sum().to(at::kFloat);
}

// Gradients of x, weight, target (none: class indices) and bias, each chunk's logits
// recomputed: d loss / d logits = (softmax - one_hot(target)) * the row's loss gradient.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const OptTensor& bias, int64_t ignore_index, c10::string_view reduction_name) {
  const Reduction reduction = parse_reduction(std::string(reduction_name));
  check_args(x, weight, target, bias, ignore_index);
  const Rows r(x, weight, target);
  const at::Tensor &x2 = r.x, &t = r.target;
  const int64_t rows = r.rows, hidden = r.hidden, vocab = r.vocab, chunk = r.chunk;
  // The loss gradient of each row: grad_loss itself (none), broadcast (sum), or over the count
  // of targets not ignored (mean).
  at::Tensor row_grad = f32(grad_loss);
  if (reduction == Reduction::kNone) {
    row_grad = row_grad.reshape({-1});
  } else {
    if (reduction == Reduction::kMean) row_grad = row_grad / (t != ignore_index).sum().to(at::kFloat);
    row_grad = row_grad.expand({rows});
  }
  at::Tensor grad_x = at::empty_like(x2);
  at::Tensor grad_w = at::zeros({vocab, hidden}, weight.options().dtype(at::kFloat));
  at::Tensor grad_b = bias ? at::zeros({vocab}, weight.options().dtype(at::kFloat)) : at::Tensor();
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r1 = std::min(rows, r0 + chunk);
    const at::Tensor xc = x2.slice(0, r0, r1), tc = t.slice(0, r0, r1), valid = tc != ignore_index;
    at::Tensor logits = chunk_logits(xc, weight, bias);
    const at::Tensor lse = std::get<1>(chunk_loss(logits, tc, valid));
    // In place: logits -> softmax -> minus the one-hot -> times the row's gradient.
    logits.sub_(lse.unsqueeze(1)).exp_();
    logits.scatter_add_(1, tc.where(valid, 0).unsqueeze(1), -valid.to(at::kFloat).unsqueeze(1));
    logits.mul_(row_grad.slice(0, r0, r1).where(valid, 0.0).unsqueeze(1));
    if (bias) grad_b.add_(logits.sum(0));
    const at::Tensor dlogits = logits.to(x.scalar_type());
    grad_x.slice(0, r0, r1).copy_(mm_f32(dlogits, weight));  // rounded once, by the copy
    // (an fp32 product, then added: addmm's out_dtype form takes a 16-bit addend only on
    // some torch versions)
    grad_w.add_(mm_f32(dlogits.t(), xc));
  }
  return {grad_x.view(x.sizes()), grad_w.to(weight.scalar_type()), none_grad(target),
          bias ? grad_b.to(bias->scalar_type()) : none_grad(x)};
}

at::Tensor fused_linear_cross_entropy_meta(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
                                           const OptTensor& bias, int64_t ignore_index,
                                           c10::string_view reduction_name) {
  const Reduction reduction = parse_reduction(std::string(reduction_name));
  check_args(x, weight, target, bias, ignore_index, /*check_values=*/false);
  const at::TensorOptions options = x.options().dtype(at::kFloat);
  return reduction == Reduction::kNone ? at::empty_symint(target.sym_sizes(), options) : at::empty({}, options);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy_backward_meta(
    const at::Tensor& grad_loss, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const OptTensor& bias, int64_t ignore_index, c10::string_view reduction_name) {
  parse_reduction(std::string(reduction_name));
  check_args(x, weight, target, bias, ignore_index, /*check_values=*/false);
  return {at::empty_like(x), at::empty_like(weight), none_grad(target), bias ? at::empty_like(*bias) : none_grad(x)};
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) {
  m.impl("fused_linear_cross_entropy", &fused_linear_cross_entropy);
  m.impl("fused_linear_cross_entropy_backward", &fused_linear_cross_entropy_backward);
}
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) {
  m.impl("fused_linear_cross_entropy", &fused_linear_cross_entropy);
  m.impl("fused_linear_cross_entropy_backward", &fused_linear_cross_entropy_backward);
}
LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  m.impl("fused_linear_cross_entropy", &fused_linear_cross_entropy_meta);
  m.impl("fused_linear_cross_entropy_backward", &fused_linear_cross_entropy_backward_meta);
}

}  // namespace ltx_kernels::torch_ext

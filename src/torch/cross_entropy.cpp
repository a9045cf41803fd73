// fused_linear_cross_entropy: cross_entropy(x @ weight.T + bias, target), the loss of an LLM's
// head, without the [tokens, vocab] logits. Stock transformers materializes them in the
// model's dtype and again in fp32 (for Llama-3-8B at 8192 tokens: 2.1 + 4.2 GB, plus the same
// again for their gradient); here the vocabulary goes through in chunks of classes whose fp32
// logits [tokens, chunk] are about twice x's bytes, so the head's peak memory is a chunk's.
//
// Chunks of classes, not of tokens: the weight gradient of a chunk of classes is complete
// after one GEMM over all tokens (written once, in the weight's dtype), where chunks of tokens
// would add a [vocab, hidden] partial product per chunk (for Llama-3-8B, 2.1 GB of fp32 read
// and written 32 times a step); what accumulates here is x's gradient, [tokens, hidden] fp32,
// in the GEMM (beta = 1).
//
// Forward, per chunk: the logits GEMM (cuBLAS, fp32 out), then one pass (include/ltx_kernels/
// cross_entropy.h) carrying each row's online max and sum and picking the target's logit. The
// op returns the loss and each row's log-sum-exp; autograd saves the latter (autograd.cpp), so
// the backward recomputes each chunk's logits but not the softmax's normalizer: a training
// step runs the head's GEMM four times where stock runs it three, the price of not keeping the
// logits. Backward, per chunk: the logits again, one pass writing d loss / d logits rounded
// to x's dtype (as stock autograd feeds its gradient GEMMs), then the weight's rows of the
// chunk and the accumulation into x's gradient. Logits, softmax and both GEMMs' sums in fp32;
// each gradient rounded once. The lse output is differentiable (a z-loss on it trains).
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "ltx_kernels/cross_entropy.h"
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

// The backward's own tensors: the outputs' gradients and the saved outputs, float32 on x's
// device (any layout: each is read through a reshape), loss and grad_loss of the reduction's
// shape (target's for 'none', 0-dim otherwise), lse and grad_lse of target's.
void check_backward_args(const at::Tensor& grad_loss, const at::Tensor& grad_lse, const at::Tensor& x,
                         const at::Tensor& target, Reduction reduction, const at::Tensor& loss, const at::Tensor& lse) {
  constexpr const char* kOp = "fused_linear_cross_entropy_backward";
  const bool per_token = reduction == Reduction::kNone;
  const struct {
    const at::Tensor& t;
    const char* name;
    bool of_loss;
  } args[] = {{grad_loss, "grad_loss", true}, {grad_lse, "grad_lse", false}, {loss, "loss", true}, {lse, "lse", false}};
  for (const auto& a : args) {
    TORCH_CHECK_TYPE(a.t.scalar_type() == at::kFloat, kOp, ": ", std::string(a.name),
                     " must be float32 (as the forward's outputs and their gradients), got ", a.t.scalar_type());
    TORCH_CHECK_VALUE(a.t.device() == x.device(), kOp, ": ", std::string(a.name), " must be on x's device ",
                      device_str(x.device()), ", got ", device_str(a.t.device()));
    const c10::SymIntArrayRef shape = a.of_loss && !per_token ? c10::SymIntArrayRef() : target.sym_sizes();
    TORCH_CHECK_VALUE(a.t.sym_sizes() == shape, kOp, ": ", std::string(a.name), " must have shape ", dims_str(shape),
                      std::string(a.of_loss && !per_token ? " (a reduced loss)" : " (target's)"), ", got ",
                      dims_str(a.t.sym_sizes()));
  }
}

// Classes per chunk: fp32 logits of about twice x's bytes (the hidden size for 16-bit x, twice
// it for fp32), a multiple of 128, at most the vocabulary.
int64_t chunk_classes(int64_t hidden, int64_t vocab, int64_t x_bytes) {
  const int64_t want = std::max<int64_t>(128, (2 * hidden * x_bytes / 4 + 127) / 128 * 128);
  return std::min(want, vocab);
}

OptTensor contiguous(const OptTensor& t) { return t ? OptTensor(t->contiguous()) : std::nullopt; }

// The call as rows: x [rows, hidden], target [rows] with ignored tokens as -1, which rows count.
struct Rows {
  Rows(const at::Tensor& x_, const at::Tensor& weight, const at::Tensor& target_, int64_t ignore_index)
      : hidden(x_.size(-1)), vocab(weight.size(0)), x(x_.reshape({target_.numel(), hidden})),
        valid(target_.reshape({-1}) != ignore_index), target(target_.reshape({-1}).where(valid, -1).contiguous()),
        rows(x.size(0)), chunk(chunk_classes(hidden, vocab, x_.element_size())) {}
  int64_t hidden, vocab;
  at::Tensor x, valid, target;
  int64_t rows, chunk;
};

// The op's own GEMMs run as written inside an autocast region too (a backward run there would
// otherwise give bf16 logits to the fp32 passes): autocast decides the inputs' dtype (the op's
// Autocast kernel, autocast.cpp), the op its internal precision.
using NoAutocast = c10::impl::ExcludeDispatchKeyGuard;

// a @ b in fp32 from 16-bit operands: cuBLAS writes fp32 directly on CUDA; elsewhere upcast.
at::Tensor mm_f32(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kFloat) return at::mm(a, b);
  if (a.is_cuda()) return at::mm(a, b, at::kFloat);
  return at::mm(f32(a), f32(b));
}

// The chunk [v0, v0 + logits.size(1)) of a call: its logits and its slice of the (contiguous) bias.
CrossEntropyChunk chunk_of(const Rows& r, const at::Tensor& logits, const OptTensor& bias, int64_t v0) {
  CrossEntropyChunk c;
  c.rows = r.rows;
  c.cols = logits.size(1);
  c.logits = logits.const_data_ptr<float>();
  c.logits_row_stride = logits.stride(0);
  if (bias) {
    c.bias_dtype = to_dtype(bias->scalar_type());
    c.bias = static_cast<const char*>(bias->const_data_ptr()) + v0 * bias->element_size();
  }
  c.target = r.target.const_data_ptr<int64_t>();
  c.class0 = v0;
  return c;
}

// The loss of each row (0 where ignored) and its log-sum-exp.
std::tuple<at::Tensor, at::Tensor> row_losses(const Rows& r, const at::Tensor& weight, const OptTensor& bias,
                                              const at::Tensor& like) {
  const at::TensorOptions f32_options = like.options().dtype(at::kFloat);
  at::Tensor row_max = at::full({r.rows}, -INFINITY, f32_options), row_sum = at::zeros({r.rows}, f32_options);
  at::Tensor picked = at::zeros({r.rows}, f32_options);
  for (int64_t v0 = 0; v0 < r.vocab; v0 += r.chunk) {
    const at::Tensor logits = mm_f32(r.x, weight.slice(0, v0, std::min(r.vocab, v0 + r.chunk)).t());
    CrossEntropyStatsParams p;
    p.chunk = chunk_of(r, logits, bias, v0);
    p.row_max = row_max.mutable_data_ptr<float>();
    p.row_sum = row_sum.mutable_data_ptr<float>();
    p.picked = picked.mutable_data_ptr<float>();
    run(p, like, "fused_linear_cross_entropy");
  }
  at::Tensor lse = row_max + row_sum.log();
  return {(lse - picked).where(r.valid, 0.0), lse};
}

std::tuple<at::Tensor, at::Tensor> fused_linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight,
                                                              const at::Tensor& target, const OptTensor& bias,
                                                              int64_t ignore_index, c10::string_view reduction_name) {
  const Reduction reduction = parse_reduction(std::string(reduction_name));
  check_args(x, weight, target, bias, ignore_index);
  const NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  const Rows r(x, weight, target, ignore_index);
  auto [losses, lse] = row_losses(r, weight, contiguous(bias), x);
  lse = lse.view(target.sizes());
  if (reduction == Reduction::kNone) return {losses.view(target.sizes()), lse};
  const at::Tensor total = losses.sum();
  // mean over the targets not ignored, as torch's cross_entropy (0 / 0 = NaN when all are)
  return {reduction == Reduction::kSum ? total : total / r.valid.sum().to(at::kFloat), lse};
}

// Gradients of x, weight, target (none: class indices) and bias, each chunk's logits
// recomputed: d loss / d logits = softmax * (g_loss + g_lse) - one_hot(target) * g_loss per row.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& grad_lse, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& target, const OptTensor& bias, int64_t ignore_index, c10::string_view reduction_name,
    const at::Tensor& loss, const at::Tensor& lse) {
  constexpr const char* kOp = "fused_linear_cross_entropy_backward";
  const Reduction reduction = parse_reduction(std::string(reduction_name));
  check_args(x, weight, target, bias, ignore_index);
  check_backward_args(grad_loss, grad_lse, x, target, reduction, loss, lse);
  const NoAutocast no_autocast(c10::autocast_dispatch_keyset);
  const Rows r(x, weight, target, ignore_index);
  const OptTensor bias_c = contiguous(bias);
  // The loss gradient of each row: grad_loss itself (none), broadcast (sum), or over the count
  // of targets not ignored (mean); 0 on ignored rows.
  at::Tensor row_grad = f32(grad_loss);
  if (reduction == Reduction::kNone) {
    row_grad = row_grad.reshape({-1});
  } else {
    if (reduction == Reduction::kMean) row_grad = row_grad / r.valid.sum().to(at::kFloat);
    row_grad = row_grad.expand({r.rows});
  }
  const at::Tensor target_weight = row_grad.where(r.valid, 0.0).contiguous();
  const at::Tensor softmax_weight = (target_weight + f32(grad_lse).reshape({-1})).contiguous();
  const at::Tensor lse_rows = lse.reshape({-1}).contiguous();
  // d loss / d logits in x's dtype for the GEMMs; in fp32 first when the bias's gradient (its
  // column sums) is wanted, so that it is rounded once.
  const at::ScalarType logit_grad_dtype = bias ? at::kFloat : x.scalar_type();
  at::Tensor grad_x = at::zeros({r.rows, r.hidden}, x.options().dtype(at::kFloat));
  at::Tensor grad_w = at::empty_like(weight, at::MemoryFormat::Contiguous);
  at::Tensor grad_b = bias ? at::empty({r.vocab}, x.options().dtype(at::kFloat)) : at::Tensor();
  for (int64_t v0 = 0; v0 < r.vocab; v0 += r.chunk) {
    const int64_t v1 = std::min(r.vocab, v0 + r.chunk);
    const at::Tensor w = weight.slice(0, v0, v1);
    const at::Tensor logits = mm_f32(r.x, w.t());
    at::Tensor dlogits = at::empty({r.rows, v1 - v0}, x.options().dtype(logit_grad_dtype));
    CrossEntropyGradParams p;
    p.chunk = chunk_of(r, logits, bias_c, v0);
    p.lse = lse_rows.const_data_ptr<float>();
    p.softmax_weight = softmax_weight.const_data_ptr<float>();
    p.target_weight = target_weight.const_data_ptr<float>();
    p.grad_dtype = to_dtype(logit_grad_dtype);
    p.grad = dlogits.mutable_data_ptr();
    p.grad_row_stride = dlogits.stride(0);
    run(p, x, kOp);
    if (bias) {
      grad_b.slice(0, v0, v1).copy_(dlogits.sum(0));
      dlogits = dlogits.to(x.scalar_type());
    }
    at::Tensor grad_w_rows = grad_w.slice(0, v0, v1);
    if (x.scalar_type() == at::kFloat) {
      at::mm_out(grad_w_rows, dlogits.t(), r.x);
      grad_x.addmm_(dlogits, w);
    } else if (x.is_cuda()) {
      at::mm_out(grad_w_rows, dlogits.t(), r.x);  // fp32 sums, rounded once by cuBLAS
      at::addmm_out(grad_x, grad_x, dlogits, w, at::kFloat);  // grad_x += dlogits @ w, in the GEMM
    } else {
      grad_w_rows.copy_(at::mm(f32(dlogits).t(), f32(r.x)));
      grad_x.addmm_(f32(dlogits), f32(w));
    }
  }
  return {grad_x.to(x.scalar_type()).view(x.sizes()), grad_w, none_grad(target),
          bias ? grad_b.to(bias->scalar_type()) : none_grad(x)};
}

std::tuple<at::Tensor, at::Tensor> fused_linear_cross_entropy_meta(const at::Tensor& x, const at::Tensor& weight,
                                                                   const at::Tensor& target, const OptTensor& bias,
                                                                   int64_t ignore_index,
                                                                   c10::string_view reduction_name) {
  const Reduction reduction = parse_reduction(std::string(reduction_name));
  check_args(x, weight, target, bias, ignore_index, /*check_values=*/false);
  const at::TensorOptions options = x.options().dtype(at::kFloat);
  at::Tensor lse = at::empty_symint(target.sym_sizes(), options);
  return {reduction == Reduction::kNone ? at::empty_symint(target.sym_sizes(), options) : at::empty({}, options), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy_backward_meta(
    const at::Tensor& grad_loss, const at::Tensor& grad_lse, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& target, const OptTensor& bias, int64_t ignore_index, c10::string_view reduction_name,
    const at::Tensor& loss, const at::Tensor& lse) {
  const Reduction reduction = parse_reduction(std::string(reduction_name));
  check_args(x, weight, target, bias, ignore_index, /*check_values=*/false);
  check_backward_args(grad_loss, grad_lse, x, target, reduction, loss, lse);
  return {meta_grad(x), meta_grad(weight), none_grad(target), bias ? meta_grad(*bias) : none_grad(x)};
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) {
  LTX_KERNELS_IMPL(m, "fused_linear_cross_entropy", fused_linear_cross_entropy);
  LTX_KERNELS_IMPL(m, "fused_linear_cross_entropy_backward", fused_linear_cross_entropy_backward);
}
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) {
  LTX_KERNELS_IMPL(m, "fused_linear_cross_entropy", fused_linear_cross_entropy);
  LTX_KERNELS_IMPL(m, "fused_linear_cross_entropy_backward", fused_linear_cross_entropy_backward);
}
LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  LTX_KERNELS_IMPL(m, "fused_linear_cross_entropy", fused_linear_cross_entropy_meta);
  LTX_KERNELS_IMPL(m, "fused_linear_cross_entropy_backward", fused_linear_cross_entropy_backward_meta);
}

}  // namespace ltx_kernels::torch_ext

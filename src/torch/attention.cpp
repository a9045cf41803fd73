// torch binding of attention (include/ltx_kernels/attention.h): SDPA's layout and mask
// semantics, non-causal, precision 'bf16' (exact) or '8bit' (INT8 q and k with K smoothing).
//
// The CPU implementation is the C++ reference: the definition of the 8-bit method that the
// GPU kernel is held to. CUDA: bf16/fp16, head_dim 64 or 128 (others raise).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "ltx_kernels/attention.h"
#include "torch/backward.h"
#include "torch/common.h"
#include "torch/registration.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace ltx_kernels::torch_ext {
namespace {

AttentionPrecision precision_of(c10::string_view precision) {
  if (precision == "8bit") return AttentionPrecision::kInt8QK;
  TORCH_CHECK_VALUE(precision == "bf16", "attention: precision must be 'bf16' or '8bit', got '",
                    std::string(precision), "'");
  return AttentionPrecision::kExact;
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_activation(*t, name);
    TORCH_CHECK_VALUE(t->dim() == 4, "attention: ", name, " must be [B, H, S, D] (SDPA's layout), got ",
                      dims_str(t->sym_sizes()));
  }
  check_like(v, "v", k, "k");
  TORCH_CHECK_TYPE(q.scalar_type() == k.scalar_type(), "attention: k must have q's dtype (",
                   q.scalar_type(), "), got ", k.scalar_type());
  TORCH_CHECK_VALUE(q.device() == k.device(), "attention: k must be on q's device (", device_str(q.device()),
                    "), got ", device_str(k.device()));
  TORCH_CHECK_VALUE(k.sym_size(0) == q.sym_size(0) && k.sym_size(3) == q.sym_size(3),
                    "attention: k and v must have q's batch and head_dim: q ", dims_str(q.sym_sizes()), ", k ",
                    dims_str(k.sym_sizes()));
  TORCH_CHECK_VALUE(q.sym_size(1) % k.sym_size(1) == 0, "attention: q's heads must be a multiple of k's "
                    "(grouped-query attention): q ", dims_str(q.sym_sizes()), ", k ", dims_str(k.sym_sizes()));
}

// The mask's dtype, device and shape (every device, Meta included).
void check_mask(const at::Tensor& mask, const at::Tensor& q, const at::Tensor& k) {
  TORCH_CHECK_TYPE(mask.scalar_type() == at::kBool || at::isFloatingType(mask.scalar_type()),
                   "attention: attn_mask must be bool (True = attend) or floating (added to the scores), got ",
                   mask.scalar_type());
  TORCH_CHECK_VALUE(mask.device() == q.device(), "attention: attn_mask must be on q's device (",
                    device_str(q.device()), "), got ", device_str(mask.device()));
  const c10::SymInt full[] = {q.sym_size(0), q.sym_size(1), q.sym_size(2), k.sym_size(2)};
  TORCH_CHECK_VALUE(mask.dim() <= 4 && at::is_expandable_to(mask.sym_sizes(), full),
                    "attention: attn_mask must broadcast to [B, Hq, Sq, Sk] = ", dims_str(full),
                    ", got ", dims_str(mask.sym_sizes()));
}

// The mask as fp32 additive [B, Hq, Sq, Sk] (broadcast by strides of 0), last dim contiguous.
at::Tensor additive_mask(const at::Tensor& mask, const at::Tensor& q, const at::Tensor& k) {
  check_mask(mask, q, k);
  const std::vector<int64_t> full = {q.size(0), q.size(1), q.size(2), k.size(2)};
  at::Tensor additive = mask.scalar_type() == at::kBool
                            ? at::where(mask, 0.0f, -std::numeric_limits<float>::infinity()).to(at::kFloat)
                            : mask.to(at::kFloat);
  additive = additive.expand(full);
  return additive.size(-1) > 1 && additive.stride(-1) != 1 ? additive.contiguous() : additive;
}

// A dim of size 1 is never stepped along: its stride (which torch leaves arbitrary) reads as 0.
Strides4 strides_of(const at::Tensor& t) {
  const auto stride = [&](int64_t d) { return t.size(d) == 1 ? 0 : t.stride(d); };
  return {stride(0), stride(1), stride(2)};
}

at::Tensor attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& attn_mask,
                          std::optional<double> scale, c10::string_view precision) {
  check_qkv(q, k, v);
  if (attn_mask) check_mask(*attn_mask, q, k);
  precision_of(precision);
  // [B, H, S, D] laid out as [B, S, H, D], as SDPA's flash backend returns it: the models'
  // out.transpose(1, 2).flatten(2) (heads back into channels) is then a view, not a copy.
  return at::empty_symint({q.sym_size(0), q.sym_size(2), q.sym_size(1), q.sym_size(3)}, q.options())
      .permute({0, 2, 1, 3});
}

AttentionParams params_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                          std::optional<double> scale, c10::string_view precision, const at::Tensor& out) {
  AttentionParams p;
  p.dtype = to_dtype(q.scalar_type());
  p.precision = precision_of(precision);
  p.batch = q.size(0);
  p.heads_q = q.size(1);
  p.heads_kv = k.size(1);
  p.seq_q = q.size(2);
  p.seq_k = k.size(2);
  p.head_dim = q.size(3);
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim)));
  p.q = q.const_data_ptr();
  p.q_strides = strides_of(q);
  p.k = k.const_data_ptr();
  p.k_strides = strides_of(k);
  p.v = v.const_data_ptr();
  p.v_strides = strides_of(v);
  if (mask.defined()) {
    p.mask = mask.const_data_ptr<float>();
    p.mask_strides = strides_of(mask);
  }
  p.out = out.mutable_data_ptr();
  p.out_strides = strides_of(out);
  return p;
}

at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& attn_mask,
                         std::optional<double> scale, c10::string_view precision) {
  at::Tensor out = attention_meta(q, k, v, attn_mask, scale, precision);
  const at::Tensor mask = attn_mask ? additive_mask(*attn_mask, q, k) : at::Tensor();
  const AttentionParams p = params_of(q, k, v, mask, scale, precision, out);
  check_core(p, "attention");
  reference(p);
  return out;
}

#ifdef LTX_KERNELS_WITH_CUDA
at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& attn_mask,
                          std::optional<double> scale, c10::string_view precision) {
  at::Tensor out = attention_meta(q, k, v, attn_mask, scale, precision);
  TORCH_CHECK_TYPE(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf,
                   "attention: on CUDA, q, k and v must be bfloat16 or float16, got ", q.scalar_type());
  TORCH_CHECK_VALUE(q.size(3) == 64 || q.size(3) == 128, "attention: on CUDA, head_dim must be 64 or 128, got ",
                    std::to_string(q.size(3)));
  check_compute_capability(q, 80, "attention",
                           "lacks the tensor-core instructions of the attention kernels (cp.async, "
                           "m16n8k16 mma.sync: Ampere and newer have them; use SDPA there)");
  const at::Tensor mask = attn_mask ? additive_mask(*attn_mask, q, k) : at::Tensor();
  // A view whose rows are not 16-byte aligned (an odd offset into a larger tensor) is copied
  // once, O(S D) beside attention's O(S^2 D).
  const at::Tensor q16 = aligned16(q), k16 = aligned16(k), v16 = aligned16(v);
  AttentionParams p = params_of(q16, k16, v16, mask, scale, precision, out);
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.device().index());
  p.arch = prop->major * 10 + prop->minor;
  check_core(p, "attention");
  if (ValidationError error = cuda_support(p)) TORCH_CHECK_VALUE(false, "attention: ", error);
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor workspace = at::empty({workspace_bytes(p)}, q.options().dtype(at::kByte));
  const cudaError_t error = launch(p, workspace.data_ptr(), c10::cuda::getCurrentCUDAStream(q.device().index()));
  TORCH_CHECK(error == cudaSuccess, "attention: CUDA launch failed: ", cudaGetErrorString(error));
  return out;
}
#endif

using Grads4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// attention_backward's arguments: attention's, and grad_out of the output's shape and dtype.
// Returns the mask's sizes padded on the left to 4 dims when the mask gets a gradient (a
// floating one), else an empty vector.
std::vector<int64_t> check_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const OptTensor& attn_mask, c10::string_view precision) {
  check_qkv(q, k, v);
  if (attn_mask) check_mask(*attn_mask, q, k);
  precision_of(precision);
  TORCH_CHECK_TYPE(grad_out.scalar_type() == q.scalar_type(), "attention_backward: grad_out must have q's dtype (",
                   q.scalar_type(), "), got ", grad_out.scalar_type());
  TORCH_CHECK_VALUE(grad_out.device() == q.device(), "attention_backward: grad_out must be on q's device (",
                    device_str(q.device()), "), got ", device_str(grad_out.device()));
  TORCH_CHECK_VALUE(grad_out.sym_sizes() == q.sym_sizes(), "attention_backward: grad_out must have the output's "
                    "shape, q's ", dims_str(q.sym_sizes()), ", got ", dims_str(grad_out.sym_sizes()));
  if (!attn_mask || !at::isFloatingType(attn_mask->scalar_type())) return {};
  std::vector<int64_t> sizes(4 - attn_mask->dim(), 1);
  for (const int64_t n : attn_mask->sizes()) sizes.push_back(n);
  return sizes;
}

Grads4 attention_backward_meta(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const OptTensor& attn_mask, std::optional<double> scale,
                               c10::string_view precision) {
  const bool mask_grad = !check_backward(grad_out, q, k, v, attn_mask, precision).empty();
  return {meta_grad(q), meta_grad(k), meta_grad(v), mask_grad ? meta_grad(*attn_mask) : none_grad(attn_mask ? *attn_mask : q)};
}

// attention's backward, for both precisions: the gradient of exact attention at q, k, v and
// the mask (for '8bit', of the attention the 8-bit method approximates: its rounding passes
// the gradient straight through, as in quantization-aware training). A composite of ATen ops
// in fp32 on any device: the probabilities recomputed from q, k and the mask, then
// dV = P^T dO, dS = P * (dO V^T - rowsum(P * dO V^T)), dQ = dS K scale, dK = dS^T Q scale,
// and the mask's gradient dS summed over the dims it broadcasts along. Chunks of heads and
// query rows keep each [heads, rows, Sk] fp32 temporary within 2^25 elements (128 MiB), so
// memory stays bounded at any sequence length. Correct, not fused: a flash-attention backward
// kernel (tiles of S in registers, never in memory) is not written yet. A fully masked row gets
// zero gradients (its output is 0 whatever q, k, v are); a NaN score makes its row's NaN. A
// bool mask, which has no gradient, gets none_grad's empty tensor (of its dtype), as an absent
// one does (of q's).
Grads4 attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const OptTensor& attn_mask, std::optional<double> scale, c10::string_view precision) {
  const std::vector<int64_t> mask_sizes = check_backward(grad_out, q, k, v, attn_mask, precision);
  const int64_t batch = q.size(0), heads = q.size(1), heads_kv = k.size(1), seq_q = q.size(2), seq_k = k.size(2);
  const int64_t group = heads / heads_kv;
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const at::Tensor mask = attn_mask ? additive_mask(*attn_mask, q, k) : at::Tensor();
  const auto fp32 = q.options().dtype(at::kFloat);
  at::Tensor dq = at::empty(q.sizes(), fp32), dk = at::zeros(k.sizes(), fp32), dv = at::zeros(v.sizes(), fp32);
  at::Tensor dmask = mask_sizes.empty() ? at::Tensor() : at::zeros(mask_sizes, fp32);
  constexpr int64_t kBudget = int64_t{1} << 25;  // fp32 elements of one [heads, rows, Sk] temporary
  const int64_t per_head = std::max<int64_t>(seq_q * seq_k, 1);
  const int64_t chunk_heads = std::clamp<int64_t>(kBudget / per_head, 1, heads);
  const int64_t chunk_rows = chunk_heads > 1 ? seq_q : std::max<int64_t>(kBudget / std::max<int64_t>(seq_k, 1), 1);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h0 = 0; h0 < heads; h0 += chunk_heads) {
      const int64_t h1 = std::min(heads, h0 + chunk_heads);
      // Each q head's kv head (grouped-query attention): their gradients are summed into it.
      const at::Tensor kv_head = at::arange(h0, h1, q.options().dtype(at::kLong)).div_(group, "floor");
      const at::Tensor kf = f32(k[b].index_select(0, kv_head));  // [h, Sk, D]
      const at::Tensor vf = f32(v[b].index_select(0, kv_head));
      at::Tensor dk_heads = at::zeros_like(kf), dv_heads = at::zeros_like(vf);
      for (int64_t r0 = 0; r0 < seq_q; r0 += chunk_rows) {
        const int64_t r1 = std::min(seq_q, r0 + chunk_rows);
        const at::Tensor qf = f32(q[b].slice(0, h0, h1).slice(1, r0, r1));  // [h, r, D]
        const at::Tensor go = f32(grad_out[b].slice(0, h0, h1).slice(1, r0, r1));
        at::Tensor s = at::matmul(qf, kf.transpose(-1, -2)).mul_(sc);  // [h, r, Sk]
        if (mask.defined()) s.add_(mask[b].slice(0, h0, h1).slice(1, r0, r1));
        at::Tensor row_max = std::get<0>(s.max(-1, /*keepdim=*/true));
        row_max.masked_fill_(row_max == neg_inf, 0.0);  // a fully masked row: exp gives 0, not NaN
        at::Tensor p = s.sub_(row_max).exp_();
        const at::Tensor total = p.sum(-1, /*keepdim=*/true);
        p.div_(total).masked_fill_(total == 0, 0.0);
        dv_heads.add_(at::matmul(p.transpose(-1, -2), go));
        at::Tensor ds = at::matmul(go, vf.transpose(-1, -2));  // dP, then dS in place
        ds.sub_((p * ds).sum(-1, /*keepdim=*/true)).mul_(p);
        dq[b].slice(0, h0, h1).slice(1, r0, r1).copy_(at::matmul(ds, kf).mul_(sc));
        dk_heads.add_(at::matmul(ds.transpose(-1, -2), qf).mul_(sc));
        if (dmask.defined()) {  // this chunk's part of the mask, summed where the mask broadcasts
          at::Tensor into = dmask[mask_sizes[0] == 1 ? 0 : b];
          if (mask_sizes[1] != 1) into = into.slice(0, h0, h1);
          if (mask_sizes[2] != 1) into = into.slice(1, r0, r1);
          into.add_(reduce_like(ds, into));
        }
      }
      dk[b].index_add_(0, kv_head, dk_heads);
      dv[b].index_add_(0, kv_head, dv_heads);
    }
  }
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()),
          dmask.defined() ? dmask.view(attn_mask->sizes()).to(attn_mask->scalar_type())
                          : none_grad(attn_mask ? *attn_mask : q)};
}

bool has_sm90a_kernels() {
#ifdef LTX_KERNELS_SM90A
  return true;
#else
  return false;
#endif
}

}  // namespace

// (no tensor argument to dispatch on: one kernel for every key)
LTX_KERNELS_LIBRARY_IMPL(CompositeImplicitAutograd, m) { m.impl("has_sm90a_kernels", &has_sm90a_kernels); }
LTX_KERNELS_LIBRARY_IMPL(CPU, m) {
  LTX_KERNELS_IMPL(m, "attention", attention_cpu);
  LTX_KERNELS_IMPL(m, "attention_backward", attention_backward);
}
LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  LTX_KERNELS_IMPL(m, "attention", attention_meta);
  LTX_KERNELS_IMPL(m, "attention_backward", attention_backward_meta);
}
#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) {
  LTX_KERNELS_IMPL(m, "attention", attention_cuda);
  LTX_KERNELS_IMPL(m, "attention_backward", attention_backward);
}
#endif

}  // namespace ltx_kernels::torch_ext

// Every operator's schema, in one place. Implementations (CPU, CUDA, Meta) live in the file
// of their op family. Float arguments are `float` (double) in schemas, as torch requires.
#include <string>

#include "torch/registration.h"

LTX_KERNELS_LIBRARY(m) {
  // An op without a backward gets the Autograd kernel that raises when an input requires grad
  // (autograd.cpp) instead of torch's silent None gradients; so do the backward ops (no double
  // backward). An op with a backward is defined with it: `<name>_backward(<gradients of the
  // outputs>, <the op's arguments>) -> <one gradient per tensor argument>` (norm_backward.cpp,
  // elementwise_backward.cpp, rope_backward.cpp; none for an argument whose gradient_is another
  // one), and gets the Autograd kernel that calls it.
  const auto with_autograd = [&m](const char* schema, torch::CppFunction kernel) {
    m.def(schema);
    const std::string name(schema, std::string(schema).find('('));
    m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::Autograd, std::move(kernel)));
  };
  const auto def = [&](const char* schema) {
    with_autograd(schema, ltx_kernels::torch_ext::forward_only_kernel());
  };
  const auto def_with_backward = [&](const char* schema, const char* backward_schema) {
    with_autograd(schema, ltx_kernels::torch_ext::differentiable_kernel());
    def(backward_schema);
  };
  // Norm family (norm.cpp). weight_offset = 1 gives Gemma's (1 + weight).
  // Weight and bias of rms_norm, fused_add_rms_norm(_) and layer_norm in x's dtype or float32;
  // rms_norm's out_dtype: x's (None) or float32.
  def_with_backward("rms_norm(Tensor x, Tensor? weight=None, float eps=1e-6, float weight_offset=0.0,"
                    " ScalarType? out_dtype=None) -> Tensor",
                    "rms_norm_backward(Tensor grad_out, Tensor x, Tensor? weight=None, float eps=1e-6,"
                    " float weight_offset=0.0, ScalarType? out_dtype=None) -> (Tensor grad_x, Tensor grad_weight)");
  def_with_backward("fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight=None, float eps=1e-6,"
                    " float weight_offset=0.0) -> (Tensor out, Tensor new_residual)",
                    "fused_add_rms_norm_backward(Tensor grad_out, Tensor grad_new_residual, Tensor? x,"
                    " Tensor? residual, Tensor? weight, float eps, float weight_offset, Tensor new_residual)"
                    " -> (Tensor grad_x, Tensor grad_weight)");
  // The backward reads the saved new_residual (the rounded sum the norm read), not x and
  // residual: one hidden state a token saved where two were (x and residual are None there).
  ltx_kernels::torch_ext::save_only_when("fused_add_rms_norm", {"x", "residual"}, {});
  // x and residual have one gradient (new_residual = x + residual): the backward returns and
  // writes it once, and autograd hands the same tensor to both.
  ltx_kernels::torch_ext::gradient_is("fused_add_rms_norm", "residual", "x");
  // In place: forward-only (inference; training uses fused_add_rms_norm).
  def("fused_add_rms_norm_(Tensor x, Tensor(a!) residual, Tensor? weight=None,"
      " float eps=1e-6, float weight_offset=0.0) -> Tensor");
  def_with_backward("layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-5)"
                    " -> Tensor",
                    "layer_norm_backward(Tensor grad_out, Tensor x, Tensor? weight=None, Tensor? bias=None,"
                    " float eps=1e-5) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)");
  // DiT forms (norm.cpp): AdaLN modulation norm(x) * (1 + scale) + shift, scale/shift/gate
  // broadcast as [D], [B, 1, D] or per token [B, S, D].
  def_with_backward("adaln_rms_norm(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None,"
                    " float eps=1e-6) -> Tensor",
                    "adaln_rms_norm_backward(Tensor grad_out, Tensor x, Tensor scale, Tensor shift,"
                    " Tensor? weight=None, float eps=1e-6)"
                    " -> (Tensor grad_x, Tensor grad_scale, Tensor grad_shift, Tensor grad_weight)");
  def_with_backward("adaln_layer_norm(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None,"
                    " Tensor? bias=None, float eps=1e-6) -> Tensor",
                    "adaln_layer_norm_backward(Tensor grad_out, Tensor x, Tensor scale, Tensor shift,"
                    " Tensor? weight=None, Tensor? bias=None, float eps=1e-6) -> (Tensor grad_x,"
                    " Tensor grad_scale, Tensor grad_shift, Tensor grad_weight, Tensor grad_bias)");
  // The same into a caller's `out` (x's shape, contiguous), forward-only as every out= form.
  def("adaln_rms_norm.out(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None, float eps=1e-6, *,"
      " Tensor(a!) out) -> ()");
  def("adaln_layer_norm.out(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None, Tensor? bias=None,"
      " float eps=1e-6, *, Tensor(a!) out) -> ()");
  def_with_backward("gated_residual_adaln_rms_norm(Tensor x, Tensor y, Tensor? gate, Tensor scale,"
                    " Tensor shift, Tensor? weight=None, float eps=1e-6) -> (Tensor x_new, Tensor normed)",
                    "gated_residual_adaln_rms_norm_backward(Tensor grad_x_new, Tensor grad_normed, Tensor x,"
                    " Tensor y, Tensor? gate, Tensor scale, Tensor shift, Tensor? weight=None, float eps=1e-6)"
                    " -> (Tensor grad_x, Tensor grad_y, Tensor grad_gate, Tensor grad_scale,"
                    " Tensor grad_shift, Tensor grad_weight)");

  // The norms feeding an FP8 GEMM (norm.cpp): the normed output quantized in the same pass,
  // exactly quantize_fp8 of the dtype result (e4m3 values, fp32 scale per row). Forward-only,
  // as the FP8 path.
  def("rms_norm_fp8(Tensor x, Tensor? weight=None, float eps=1e-6, float weight_offset=0.0)"
      " -> (Tensor out_fp8, Tensor out_scale)");
  def("fused_add_rms_norm_fp8(Tensor x, Tensor residual, Tensor? weight=None, float eps=1e-6,"
      " float weight_offset=0.0) -> (Tensor out_fp8, Tensor out_scale, Tensor new_residual)");
  def("adaln_rms_norm_fp8(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None, float eps=1e-6)"
      " -> (Tensor normed_fp8, Tensor normed_scale)");
  def("adaln_layer_norm_fp8(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None, Tensor? bias=None,"
      " float eps=1e-6) -> (Tensor normed_fp8, Tensor normed_scale)");
  def("gated_residual_adaln_rms_norm_fp8(Tensor x, Tensor y, Tensor? gate, Tensor scale, Tensor shift,"
      " Tensor? weight=None, float eps=1e-6) -> (Tensor x_new, Tensor normed_fp8, Tensor normed_scale)");

  // Elementwise family (elementwise.cpp). Concatenated inputs are [..., 2H]:
  // act(x[..., :H]) * x[..., H:]. approximate: 'tanh' or 'none' (exact erf GELU). The .out
  // forms write a given tensor and return nothing (custom ops cannot return an alias).
  // The .out forms are forward-only.
  def_with_backward("gelu_tanh(Tensor x) -> Tensor", "gelu_tanh_backward(Tensor grad_out, Tensor x) -> Tensor");
  def_with_backward("gelu_tanh_and_mul(Tensor a, Tensor b) -> Tensor",
                    "gelu_tanh_and_mul_backward(Tensor grad_out, Tensor a, Tensor b) -> (Tensor grad_a, Tensor grad_b)");
  def_with_backward("gelu_and_mul(Tensor a, Tensor b) -> Tensor",
                    "gelu_and_mul_backward(Tensor grad_out, Tensor a, Tensor b) -> (Tensor grad_a, Tensor grad_b)");
  def_with_backward("silu_and_mul(Tensor a, Tensor b) -> Tensor",
                    "silu_and_mul_backward(Tensor grad_out, Tensor a, Tensor b) -> (Tensor grad_a, Tensor grad_b)");
  def_with_backward("geglu(Tensor x, str approximate='tanh') -> Tensor",
                    "geglu_backward(Tensor grad_out, Tensor x, str approximate='tanh') -> Tensor");
  def("geglu.out(Tensor x, str approximate='tanh', *, Tensor(a!) out) -> ()");
  def_with_backward("swiglu(Tensor x) -> Tensor", "swiglu_backward(Tensor grad_out, Tensor x) -> Tensor");
  def("swiglu.out(Tensor x, *, Tensor(a!) out) -> ()");
  def_with_backward("gated_residual(Tensor x, Tensor y, Tensor? gate) -> Tensor",
                    "gated_residual_backward(Tensor grad_out, Tensor x, Tensor y, Tensor? gate)"
                    " -> (Tensor grad_y, Tensor grad_gate)");
  // x's gradient is grad_out itself (out = x + y * gate): autograd passes it on, no copy.
  ltx_kernels::torch_ext::gradient_is("gated_residual", "x", "grad_out");
  // Linear + GELU-tanh with the activation in the GEMM epilogue (linear.cpp).
  def_with_backward("linear_gelu_tanh(Tensor x, Tensor weight, Tensor bias) -> Tensor",
                    "linear_gelu_tanh_backward(Tensor grad_out, Tensor x, Tensor weight, Tensor bias)"
                    " -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)");
  // A gated MLP's activation and down projection, h = act(a) * b recomputed by the backward
  // instead of kept (glu_linear.cpp).
  def_with_backward("glu_linear(Tensor a, Tensor b, Tensor weight, Tensor? bias=None, str activation=\"silu\")"
                    " -> Tensor",
                    "glu_linear_backward(Tensor grad_out, Tensor a, Tensor b, Tensor weight, Tensor? bias,"
                    " str activation) -> (Tensor grad_a, Tensor grad_b, Tensor grad_weight, Tensor grad_bias)");
  // residual + gate * (x @ weight^T + bias) in fp32, rounded once: x [B, S, K], residual [B, S, N],
  // gate [B, 1, N], [N] or none (a DiT block's gated residual written by the GEMM before it:
  // linear_gated_residual.cpp).
  def_with_backward("linear_gated_residual(Tensor x, Tensor weight, Tensor? bias, Tensor residual, Tensor? gate)"
                    " -> Tensor",
                    "linear_gated_residual_backward(Tensor grad_out, Tensor x, Tensor weight, Tensor? bias,"
                    " Tensor residual, Tensor? gate) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias,"
                    " Tensor grad_gate)");
  ltx_kernels::torch_ext::gradient_is("linear_gated_residual", "residual", "grad_out");  // (no copy)
  // An LLM head's linear + cross-entropy loss in chunks of classes, no full logits
  // (cross_entropy.cpp): the loss and each token's log-sum-exp, which the backward takes (saved,
  // not recomputed). grad_target is always empty: target holds class indices.
  def_with_backward("fused_linear_cross_entropy(Tensor x, Tensor weight, Tensor target, Tensor? bias=None,"
                    " int ignore_index=-100, str reduction='mean') -> (Tensor loss, Tensor lse)",
                    "fused_linear_cross_entropy_backward(Tensor grad_loss, Tensor grad_lse, Tensor x, Tensor weight,"
                    " Tensor target, Tensor? bias, int ignore_index, str reduction, Tensor loss, Tensor lse)"
                    " -> (Tensor grad_x, Tensor grad_weight, Tensor grad_target, Tensor grad_bias)");
  // FP8 linear path (quantize.cpp): rows to float8 e4m3 with one fp32 scale per row (of x or
  // of an activation of x: 'none' or 'gelu_tanh'), and the GEMM of two such operands (weight
  // [N, K] quantized per output channel; 'gelu_tanh' applied to its fp32 result, a
  // feed-forward's up projection).
  def("quantize_fp8(Tensor x, str activation='none') -> (Tensor q, Tensor scale)");
  def("fp8_linear(Tensor x, Tensor x_scale, Tensor weight, Tensor weight_scale, Tensor? bias,"
      " ScalarType out_dtype, str activation='none') -> Tensor");
  // residual + gate * fp8_linear(x, ...) rounded once to residual's dtype: x [B, S, K], residual
  // [B, S, N], gate [B, 1, N] or [N] (a DiT block's gated residual, written by the GEMM).
  def("fp8_linear_gated_residual(Tensor x, Tensor x_scale, Tensor weight, Tensor weight_scale, Tensor? bias,"
      " Tensor residual, Tensor? gate) -> Tensor");
  // GroupNorm (group_norm.cpp): x [N, C, *] channels first or last (out in x's layout),
  // add [N, C] added per channel before the norm (a ResNet block's time embedding), silu after.
  def_with_backward("group_norm(Tensor x, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-5,"
                    " Tensor? add=None, bool silu=False) -> Tensor",
                    "group_norm_backward(Tensor grad_out, Tensor x, int num_groups, Tensor? weight=None,"
                    " Tensor? bias=None, float eps=1e-5, Tensor? add=None, bool silu=False) -> (Tensor grad_x,"
                    " Tensor grad_weight, Tensor grad_bias, Tensor grad_add)");
  // Attention (attention.cpp): SDPA's [B, H, S, D] layout and mask semantics, non-causal;
  // precision 'bf16' (exact) or '8bit' (INT8 q and smoothed k, per-block scales).
  // Its backward (the exact attention's gradient for both precisions: straight through the
  // 8-bit rounding) returns grad_attn_mask for a floating mask, an empty tensor for a bool
  // (no gradient) or absent one.
  def_with_backward("attention(Tensor q, Tensor k, Tensor v, Tensor? attn_mask=None, float? scale=None,"
                    " str precision='bf16') -> Tensor",
                    "attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? attn_mask=None,"
                    " float? scale=None, str precision='bf16') -> (Tensor grad_q, Tensor grad_k, Tensor grad_v,"
                    " Tensor grad_attn_mask)");
  // Whether this build has the Hopper (sm_90a) kernels: the integrations route an attention to
  // ours by default only where it beats SDPA, which on Hopper takes this build's wgmma kernel.
  m.def("has_sm90a_kernels() -> bool");
  // RoPE family (rope.cpp). unsqueeze_dim as in transformers: 1 for [B, H, S, Dh] q/k, 2 for
  // [B, S, H, Dh]. sections: half-split rotation within each section (default: one).
  def_with_backward("apply_rotary_pos_emb(Tensor q, Tensor k, Tensor cos, Tensor sin, bool interleaved=False,"
                    " int unsqueeze_dim=1, int[]? sections=None) -> (Tensor q_out, Tensor k_out)",
                    "apply_rotary_pos_emb_backward(Tensor grad_q_out, Tensor grad_k_out, Tensor? q, Tensor? k,"
                    " Tensor cos, Tensor sin, bool interleaved=False, int unsqueeze_dim=1, int[]? sections=None)"
                    " -> (Tensor grad_q, Tensor grad_k, Tensor grad_cos, Tensor grad_sin)");
  def_with_backward("ltx_rope(Tensor x, Tensor cos, Tensor sin) -> Tensor",
                    "ltx_rope_backward(Tensor grad_out, Tensor? x, Tensor cos, Tensor sin)"
                    " -> (Tensor grad_x, Tensor grad_cos, Tensor grad_sin)");
  def_with_backward("ltx_rope_angles(Tensor x, int[3] grid, float[3] axis_scale, Tensor? video_coords=None,"
                    " float theta=10000.0) -> Tensor",
                    "ltx_rope_angles_backward(Tensor grad_out, Tensor? x, int[3] grid, float[3] axis_scale,"
                    " Tensor? video_coords=None, float theta=10000.0) -> (Tensor grad_x, Tensor grad_video_coords)");
  // The rotations are linear in q, k and x: the backward reads their values only for the
  // gradients of the tables (video_coords), which models build without grad. Not saving them
  // spares a Llama layer 1.25 hidden states a token of activation memory.
  ltx_kernels::torch_ext::save_only_when("apply_rotary_pos_emb", {"q", "k"}, {"cos", "sin"});
  ltx_kernels::torch_ext::save_only_when("ltx_rope", {"x"}, {"cos", "sin"});
  ltx_kernels::torch_ext::save_only_when("ltx_rope_angles", {"x"}, {"video_coords"});
  def_with_backward("ltx_qk_norm_rope(Tensor q, Tensor k, Tensor? weight_q, Tensor? weight_k, float eps,"
                    " int[3] grid, float[3] axis_scale, Tensor? video_coords=None, float theta=10000.0)"
                    " -> (Tensor q_out, Tensor k_out)",
                    "ltx_qk_norm_rope_backward(Tensor grad_q_out, Tensor grad_k_out, Tensor q, Tensor k,"
                    " Tensor? weight_q, Tensor? weight_k, float eps, int[3] grid, float[3] axis_scale,"
                    " Tensor? video_coords=None, float theta=10000.0) -> (Tensor grad_q, Tensor grad_k,"
                    " Tensor grad_weight_q, Tensor grad_weight_k, Tensor grad_video_coords)");
}

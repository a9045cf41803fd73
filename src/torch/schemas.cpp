// Every operator's schema, in one place. Implementations (CPU, CUDA, Meta) live in the file
// of their op family. Float arguments are `float` (double) in schemas, as torch requires.
#include <string>

#include "torch/registration.h"

LTX_KERNELS_LIBRARY(m) {
  // No op has a backward yet: each gets the Autograd kernel that raises when an input
  // requires grad (autograd.cpp) instead of torch's silent None gradients.
  const auto def = [&m](const char* schema) {
    m.def(schema);
    const std::string name(schema, std::string(schema).find('('));
    m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::Autograd,
                                 ltx_kernels::torch_ext::forward_only_kernel()));
  };
  // Norm family (norm.cpp). weight_offset = 1 gives Gemma's (1 + weight).
  def("rms_norm(Tensor x, Tensor? weight=None, float eps=1e-6, float weight_offset=0.0)"
      " -> Tensor");
  def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight=None, float eps=1e-6,"
      " float weight_offset=0.0) -> (Tensor out, Tensor new_residual)");
  def("fused_add_rms_norm_(Tensor x, Tensor(a!) residual, Tensor? weight=None,"
      " float eps=1e-6, float weight_offset=0.0) -> Tensor");
  def("layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-5)"
      " -> Tensor");
  // DiT forms (norm.cpp): AdaLN modulation norm(x) * (1 + scale) + shift, scale/shift/gate
  // broadcast as [D], [B, 1, D] or per token [B, S, D].
  def("adaln_rms_norm(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None,"
      " float eps=1e-6) -> Tensor");
  def("adaln_layer_norm(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None,"
      " Tensor? bias=None, float eps=1e-6) -> Tensor");
  def("gated_residual_adaln_rms_norm(Tensor x, Tensor y, Tensor? gate, Tensor scale,"
      " Tensor shift, Tensor? weight=None, float eps=1e-6) -> (Tensor x_new, Tensor normed)");

  // Elementwise family (elementwise.cpp). Concatenated inputs are [..., 2H]:
  // act(x[..., :H]) * x[..., H:]. approximate: 'tanh' or 'none' (exact erf GELU). The .out
  // forms write a given tensor and return nothing (custom ops cannot return an alias).
  def("gelu_tanh(Tensor x) -> Tensor");
  def("gelu_tanh_and_mul(Tensor a, Tensor b) -> Tensor");
  def("gelu_and_mul(Tensor a, Tensor b) -> Tensor");
  def("silu_and_mul(Tensor a, Tensor b) -> Tensor");
  def("geglu(Tensor x, str approximate='tanh') -> Tensor");
  def("geglu.out(Tensor x, str approximate='tanh', *, Tensor(a!) out) -> ()");
  def("swiglu(Tensor x) -> Tensor");
  def("swiglu.out(Tensor x, *, Tensor(a!) out) -> ()");
  def("gated_residual(Tensor x, Tensor y, Tensor? gate) -> Tensor");
  // Linear + GELU-tanh with the activation in the GEMM epilogue (linear.cpp).
  def("linear_gelu_tanh(Tensor x, Tensor weight, Tensor bias) -> Tensor");
  // FP8 linear path (quantize.cpp): rows to float8 e4m3 with one fp32 scale per row (of x or
  // of an activation of x: 'none' or 'gelu_tanh'), and the GEMM of two such operands (weight
  // [N, K] quantized per output channel).
  def("quantize_fp8(Tensor x, str activation='none') -> (Tensor q, Tensor scale)");
  def("fp8_linear(Tensor x, Tensor x_scale, Tensor weight, Tensor weight_scale, Tensor? bias,"
      " ScalarType out_dtype) -> Tensor");
  // Attention (attention.cpp): SDPA's [B, H, S, D] layout and mask semantics, non-causal;
  // precision 'bf16' (exact) or '8bit' (INT8 q and smoothed k, per-block scales).
  def("attention(Tensor q, Tensor k, Tensor v, Tensor? attn_mask=None, float? scale=None,"
      " str precision='bf16') -> Tensor");
  // RoPE family (rope.cpp). unsqueeze_dim as in transformers: 1 for [B, H, S, Dh] q/k, 2 for
  // [B, S, H, Dh]. sections: half-split rotation within each section (default: one).
  def("apply_rotary_pos_emb(Tensor q, Tensor k, Tensor cos, Tensor sin, bool interleaved=False,"
      " int unsqueeze_dim=1, int[]? sections=None) -> (Tensor q_out, Tensor k_out)");
  def("ltx_rope(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  def("ltx_rope_angles(Tensor x, int[3] grid, float[3] axis_scale, Tensor? video_coords=None,"
      " float theta=10000.0) -> Tensor");
  def("ltx_qk_norm_rope(Tensor q, Tensor k, Tensor? weight_q, Tensor? weight_k, float eps,"
      " int[3] grid, float[3] axis_scale, Tensor? video_coords=None, float theta=10000.0)"
      " -> (Tensor q_out, Tensor k_out)");
}

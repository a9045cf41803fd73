"""CUDA kernels for diffusers video transformers and transformers LLMs.

The ops are real PyTorch operators, ``torch.ops.ltx_kernels.*``, with CUDA, CPU and Meta
implementations (so they work under ``torch.compile(fullgraph=True)``). This package wraps
them with Python signatures and documentation.
"""

# Relative imports only: a Kernels Hub export imports this package under a build-unique name.
from . import layers
from .ops import (
    adaln_layer_norm,
    adaln_layernorm,
    adaln_rms_norm,
    adaln_rms_norm_fp8,
    adaln_rmsnorm,
    adaln_zero,
    apply_rotary_pos_emb,
    attention,
    fp8_linear,
    fused_add_rms_norm,
    fused_add_rms_norm_,
    gated_residual,
    gated_residual_adaln_rms_norm,
    gated_residual_adaln_rms_norm_fp8,
    geglu,
    gelu_and_mul,
    gelu_tanh,
    gelu_tanh_and_mul,
    layer_norm,
    linear_gelu_tanh,
    ltx_qk_norm_rope,
    ltx_rope,
    ltx_rope_angles,
    quantize_fp8,
    rms_norm,
    rmsnorm,
    rmsnorm_residual,
    rope_1d,
    rope_3d,
    rope_3d_sections,
    silu_and_mul,
    swiglu,
)

__version__ = "0.1.0"

__all__ = [
    "adaln_layer_norm",
    "adaln_layernorm",
    "adaln_rms_norm",
    "adaln_rms_norm_fp8",
    "adaln_rmsnorm",
    "adaln_zero",
    "apply_rotary_pos_emb",
    "attention",
    "fp8_linear",
    "fused_add_rms_norm",
    "fused_add_rms_norm_",
    "gated_residual",
    "gated_residual_adaln_rms_norm",
    "gated_residual_adaln_rms_norm_fp8",
    "geglu",
    "gelu_and_mul",
    "gelu_tanh",
    "gelu_tanh_and_mul",
    "layer_norm",
    "layers",
    "linear_gelu_tanh",
    "ltx_qk_norm_rope",
    "ltx_rope",
    "ltx_rope_angles",
    "quantize_fp8",
    "rms_norm",
    "rmsnorm",
    "rmsnorm_residual",
    "rope_1d",
    "rope_3d",
    "rope_3d_sections",
    "silu_and_mul",
    "swiglu",
]

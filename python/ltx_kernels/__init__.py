"""CUDA kernels for diffusers video transformers and transformers LLMs.

The ops are real PyTorch operators, ``torch.ops.ltx_kernels.*``, with CUDA, CPU and Meta
implementations (so they work under ``torch.compile(fullgraph=True)``). This package wraps
them with Python signatures and documentation.
"""

from pathlib import Path as _Path

import torch as _torch

_torch.ops.load_library(str(_Path(__file__).with_name("_C.so")))

from ltx_kernels import layers  # noqa: E402
from ltx_kernels.ops import (  # noqa: E402
    adaln_layer_norm,
    adaln_rms_norm,
    fused_add_rms_norm,
    fused_add_rms_norm_,
    gated_residual_adaln_rms_norm,
    layer_norm,
    rms_norm,
    rmsnorm,
    rmsnorm_residual,
)

__version__ = "0.1.0"

__all__ = [
    "adaln_layer_norm",
    "adaln_rms_norm",
    "fused_add_rms_norm",
    "fused_add_rms_norm_",
    "gated_residual_adaln_rms_norm",
    "layer_norm",
    "layers",
    "rms_norm",
    "rmsnorm",
    "rmsnorm_residual",
]

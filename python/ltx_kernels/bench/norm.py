"""Benchmark cases of the norm family, with the eager code HF models run as the anchor."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ltx_kernels
from ltx_kernels.bench.harness import Case, rel_err


def eager_rms_norm(x, weight, eps):
    """transformers' LlamaRMSNorm.forward."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(input_dtype)


def eager_fused_add_rms_norm(x, residual, weight, eps):
    """A decoder layer's residual add followed by its post-attention RMSNorm."""
    h = x + residual
    return eager_rms_norm(h, weight, eps), h


def eager_layer_norm(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _liger():
    """Liger-Kernel's autograd functions, or None when it is not installed."""
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    except ImportError:
        LigerFusedAddRMSNormFunction = None
    return LigerRMSNormFunction, LigerLayerNormFunction, LigerFusedAddRMSNormFunction


def cases(shapes: list[tuple[str, int, int]], dtype=torch.bfloat16, strided: bool = False) -> list[Case]:
    """rms_norm, fused_add_rms_norm and layer_norm at each (label, rows, D); ``strided``: x is a
    view whose rows are 64 elements further apart than D (a slice of a wider tensor)."""
    liger = _liger()
    compiled_rms = torch.compile(eager_rms_norm)
    compiled_add = torch.compile(eager_fused_add_rms_norm)
    compiled_ln = torch.compile(eager_layer_norm)
    out = []
    for label, rows, d in shapes:
        x = torch.randn(rows, d + 64 if strided else d, device="cuda", dtype=dtype)[:, :d]
        r = torch.randn(rows, d, device="cuda", dtype=dtype)
        w = torch.randn(d, device="cuda", dtype=dtype)
        b = torch.randn(d, device="cuda", dtype=dtype)
        size = x.numel() * x.element_size()
        eps = 1e-6

        impls = {
            "ltx_kernels": lambda x=x, w=w: ltx_kernels.rms_norm(x, w, eps),
            "eager": lambda x=x, w=w: eager_rms_norm(x, w, eps),
            "compile": lambda x=x, w=w: compiled_rms(x, w, eps),
        }
        if liger:
            impls["liger"] = lambda x=x, w=w: liger[0].apply(x, w, eps)
        out.append(Case("rms_norm", label, 2 * size + 2 * d, impls,
                        lambda x=x, w=w: rel_err(ltx_kernels.rms_norm(x, w, eps), eager_rms_norm(x, w, eps))))

        impls = {
            "ltx_kernels": lambda x=x, r=r, w=w: ltx_kernels.fused_add_rms_norm(x, r, w, eps),
            "eager": lambda x=x, r=r, w=w: eager_fused_add_rms_norm(x, r, w, eps),
            "compile": lambda x=x, r=r, w=w: compiled_add(x, r, w, eps),
        }
        if liger and liger[2]:
            impls["liger"] = lambda x=x, r=r, w=w: liger[2].apply(x, r, w, eps)
        out.append(Case("fused_add_rms_norm", label, 4 * size + 2 * d, impls,
                        lambda x=x, r=r, w=w: rel_err(ltx_kernels.fused_add_rms_norm(x, r, w, eps)[0],
                                                       eager_fused_add_rms_norm(x, r, w, eps)[0])))

        impls = {
            "ltx_kernels": lambda x=x, w=w, b=b: ltx_kernels.layer_norm(x, w, b, eps),
            "eager": lambda x=x, w=w, b=b: eager_layer_norm(x, w, b, eps),
            "compile": lambda x=x, w=w, b=b: compiled_ln(x, w, b, eps),
        }
        if liger:
            impls["liger"] = lambda x=x, w=w, b=b: liger[1].apply(x, w, b, eps)
        out.append(Case("layer_norm", label, 2 * size + 4 * d, impls,
                        lambda x=x, w=w, b=b: rel_err(ltx_kernels.layer_norm(x, w, b, eps),
                                                       eager_layer_norm(x, w, b, eps))))
    return out

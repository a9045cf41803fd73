"""Benchmark cases of the DiT forms: AdaLN modulation and the gated residual + next norm,
against the code diffusers' LTX-Video block runs (transformer_ltx.py)."""

from __future__ import annotations

import torch

import ltx_kernels
from ltx_kernels.bench.harness import Case, rel_err


def eager_rms_norm_no_weight(x, eps):
    """diffusers' RMSNorm(elementwise_affine=False).forward."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(variance + eps)).to(x.dtype)


def eager_norm1(x, scale, shift, eps):
    """LTX block: norm1 then AdaLN modulation."""
    return eager_rms_norm_no_weight(x, eps) * (1 + scale) + shift


def eager_gated_norm2(x, y, gate, scale, shift, eps):
    """LTX block: gated residual, then norm2 and its modulation."""
    x = x + y * gate
    return x, eager_rms_norm_no_weight(x, eps) * (1 + scale) + shift


def cases(shapes: list[tuple[str, int, int]], dtype=torch.bfloat16) -> list[Case]:
    """shapes: (label, batch * tokens, D) with batch 2 (CFG), as LTX runs them."""
    compiled_norm1 = torch.compile(eager_norm1)
    compiled_norm2 = torch.compile(eager_gated_norm2)
    out = []
    eps = 1e-6
    for label, rows, d in shapes:
        b, s = 2, rows // 2
        x = torch.randn(b, s, d, device="cuda", dtype=dtype)
        y = torch.randn(b, s, d, device="cuda", dtype=dtype)
        # Per-batch modulation unbound from [B, 1, 6, D], as text-to-video runs it.
        ada = torch.randn(b, 1, 6, d, device="cuda", dtype=dtype)
        shift, scale, gate = ada[:, :, 0], ada[:, :, 1], ada[:, :, 2]
        size = x.numel() * x.element_size()

        impls = {
            "ltx_kernels": lambda x=x, sc=scale, sh=shift: ltx_kernels.adaln_rms_norm(x, sc, sh, None, eps),
            "eager": lambda x=x, sc=scale, sh=shift: eager_norm1(x, sc, sh, eps),
            "compile": lambda x=x, sc=scale, sh=shift: compiled_norm1(x, sc, sh, eps),
        }
        check = lambda x=x, sc=scale, sh=shift: rel_err(  # noqa: E731
            ltx_kernels.adaln_rms_norm(x, sc, sh, None, eps), eager_norm1(x, sc, sh, eps))
        out.append(Case("ltx norm1 + modulation", label, 2 * size, impls, check))

        impls = {
            "ltx_kernels": lambda x=x, y=y, g=gate, sc=scale, sh=shift:
                ltx_kernels.gated_residual_adaln_rms_norm(x, y, g, sc, sh, None, eps),
            "eager": lambda x=x, y=y, g=gate, sc=scale, sh=shift: eager_gated_norm2(x, y, g, sc, sh, eps),
            "compile": lambda x=x, y=y, g=gate, sc=scale, sh=shift: compiled_norm2(x, y, g, sc, sh, eps),
        }
        check = lambda x=x, y=y, g=gate, sc=scale, sh=shift: rel_err(  # noqa: E731
            ltx_kernels.gated_residual_adaln_rms_norm(x, y, g, sc, sh, None, eps)[1],
            eager_gated_norm2(x, y, g, sc, sh, eps)[1])
        out.append(Case("ltx gated residual + norm2", label, 4 * size, impls, check))
    return out

"""Benchmark cases of the elementwise family: GELU-tanh (LTX feed-forward), SwiGLU / GEGLU
(LLM MLPs, two-input and concatenated), and the DiT gated residual."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ltx_kernels
from ltx_kernels.bench.harness import Case, rel_err


def _liger():
    """Liger-Kernel's gated-activation functions, or None when it is not installed."""
    try:
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        from liger_kernel.ops.swiglu import LigerFusedGateUpSiLUMulFunction, LigerSiLUMulFunction
    except ImportError:
        return None
    return LigerGELUMulFunction, LigerSiLUMulFunction, LigerFusedGateUpSiLUMulFunction


def eager_gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def eager_silu_and_mul(a, b):
    """transformers' LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)."""
    return F.silu(a) * b


def eager_gelu_tanh_and_mul(a, b):
    return F.gelu(a, approximate="tanh") * b


def eager_swiglu(x):
    h = x.shape[-1] // 2
    return F.silu(x[..., :h]) * x[..., h:]


def eager_gated_residual(x, y, gate):
    """LTX block: hidden_states + ff_output * gate_mlp."""
    return x + y * gate


def _case(op, label, bytes_moved, ours, eager, compiled, extra=None):
    impls = {"ltx_kernels": ours, "eager": eager, "compile": compiled, **(extra or {})}
    return Case(op, label, bytes_moved, impls, lambda: rel_err(ours(), eager()))


def cases(ltx_shapes, llm_shapes, dtype=torch.bfloat16) -> list[Case]:
    """ltx_shapes: (label, rows, D) of LTX-2B (feed-forward inner dim 4D); llm_shapes:
    (label, tokens, D) of an 8B-class LLM (intermediate 14336)."""
    liger = _liger()
    compiled = {f: torch.compile(f) for f in (eager_gelu_tanh, eager_silu_and_mul, eager_gelu_tanh_and_mul,
                                              eager_swiglu, eager_gated_residual)}
    out = []
    for label, rows, d in ltx_shapes:
        b = 2
        x = torch.randn(b, rows // b, d, device="cuda", dtype=dtype)
        y = torch.randn_like(x)
        gate = torch.randn(b, 1, 6, d, device="cuda", dtype=dtype)[:, :, 2]  # unbound, per batch
        size = x.numel() * x.element_size()
        out.append(_case("gated_residual", label, 3 * size,
                         lambda x=x, y=y, g=gate: ltx_kernels.gated_residual(x, y, g),
                         lambda x=x, y=y, g=gate: eager_gated_residual(x, y, g),
                         lambda x=x, y=y, g=gate: compiled[eager_gated_residual](x, y, g)))
        h = torch.randn(rows, 4 * d, device="cuda", dtype=dtype)
        ff_label = f"{label.split()[0]} {rows}x{4 * d}"
        out.append(_case("gelu_tanh", ff_label, 2 * h.numel() * h.element_size(),
                         lambda h=h: ltx_kernels.gelu_tanh(h),
                         lambda h=h: eager_gelu_tanh(h),
                         lambda h=h: compiled[eager_gelu_tanh](h)))
    for label, tokens, _ in llm_shapes:
        inter = 14336
        a = torch.randn(tokens, inter, device="cuda", dtype=dtype)
        bb = torch.randn_like(a)
        cat = torch.randn(tokens, 2 * inter, device="cuda", dtype=dtype)
        size = a.numel() * a.element_size()
        mlp_label = f"{label.split()[0]} {tokens}x{inter}"
        out.append(_case("silu_and_mul", mlp_label, 3 * size,
                         lambda a=a, b=bb: ltx_kernels.silu_and_mul(a, b),
                         lambda a=a, b=bb: eager_silu_and_mul(a, b),
                         lambda a=a, b=bb: compiled[eager_silu_and_mul](a, b),
                         {"liger": lambda a=a, b=bb: liger[1].apply(a, b)} if liger else None))
        out.append(_case("gelu_tanh_and_mul", mlp_label, 3 * size,
                         lambda a=a, b=bb: ltx_kernels.gelu_tanh_and_mul(a, b),
                         lambda a=a, b=bb: eager_gelu_tanh_and_mul(a, b),
                         lambda a=a, b=bb: compiled[eager_gelu_tanh_and_mul](a, b),
                         {"liger": lambda a=a, b=bb: liger[0].apply(a, b)} if liger else None))
        out.append(_case("swiglu (concatenated)", f"{label.split()[0]} {tokens}x{2 * inter}", 3 * size,
                         lambda x=cat: ltx_kernels.swiglu(x),
                         lambda x=cat: eager_swiglu(x),
                         lambda x=cat: compiled[eager_swiglu](x),
                         {"liger": lambda x=cat: liger[2].apply(x)} if liger else None))
    return out

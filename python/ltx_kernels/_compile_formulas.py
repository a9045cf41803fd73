"""The cheap ops as torch formulas, for training under torch.compile.

Compiled for training, an op of ours is opaque to Inductor: its forward and its backward op are
kernels of their own, beside the Inductor kernels that do what is around them (peft LoRA's
``base + scaling * lora`` add before each norm, the sum of two gradient paths after each norm's
backward). On an H100 that left the LTX-Video LoRA step with ~1,600 more launches than compile
alone and the Llama step with five extra passes per layer (benchmarks/results/h100/ltx_train.md,
llm_train.md). Given the formula instead, Inductor fuses the op, and its gradient, into those
kernels. So :mod:`ltx_kernels.ops` hands these formulas to the tracer when it is compiling a
call in which an input requires grad; inference under compile, and every eager call, runs our
kernels. Ops where our kernel does what Inductor cannot (the fused q/k norm + RoPE, attention,
GroupNorm, the fused cross-entropy, the GEMM epilogue GELU, RoPE) stay ours everywhere.

Each formula is the op's definition with its rounding: fp32 math, one rounding to the output
dtype, and for the fused residual forms the sum rounded to x's dtype before the norm reads it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def traced_for_training(*args) -> bool:
    """Whether torch.compile is tracing a call (``args``: the op's arguments) that autograd will
    differentiate."""
    return (torch.compiler.is_compiling() and torch.is_grad_enabled()
            and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _rms(x: torch.Tensor, weight, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return y if weight is None else y * (weight.float() + weight_offset)


def _layer(x: torch.Tensor, weight, bias, eps: float) -> torch.Tensor:
    return F.layer_norm(x.float(), x.shape[-1:], _f32(weight), _f32(bias), eps)


def _modulate(normed: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return normed * (1.0 + scale.float()) + shift.float()


def _gated_sum(x: torch.Tensor, y: torch.Tensor, gate) -> torch.Tensor:
    return x.float() + (y.float() if gate is None else y.float() * gate.float())


def rms_norm(x, weight, eps, weight_offset, out_dtype):
    return _rms(x, weight, eps, weight_offset).to(out_dtype or x.dtype)


def fused_add_rms_norm(x, residual, weight, eps, weight_offset):
    h = (x.float() + residual.float()).to(x.dtype)
    return _rms(h, weight, eps, weight_offset).to(x.dtype), h


def layer_norm(x, weight, bias, eps):
    return _layer(x, weight, bias, eps).to(x.dtype)


def adaln_rms_norm(x, scale, shift, weight, eps):
    return _modulate(_rms(x, weight, eps), scale, shift).to(x.dtype)


def adaln_layer_norm(x, scale, shift, weight, bias, eps):
    return _modulate(_layer(x, weight, bias, eps), scale, shift).to(x.dtype)


def gated_residual(x, y, gate):
    return _gated_sum(x, y, gate).to(x.dtype)


def gated_residual_adaln_rms_norm(x, y, gate, scale, shift, weight, eps):
    x_new = gated_residual(x, y, gate)
    return x_new, adaln_rms_norm(x_new, scale, shift, weight, eps)


def gelu_tanh(x):
    return F.gelu(x.float(), approximate="tanh").to(x.dtype)


def gelu_tanh_and_mul(a, b):
    return (F.gelu(a.float(), approximate="tanh") * b.float()).to(a.dtype)


def gelu_and_mul(a, b):
    return (F.gelu(a.float()) * b.float()).to(a.dtype)


def silu_and_mul(a, b):
    return (F.silu(a.float()) * b.float()).to(a.dtype)


def geglu(x, approximate: str):
    a, b = x.chunk(2, dim=-1)
    return (F.gelu(a.float(), approximate=approximate) * b.float()).to(x.dtype)


def swiglu(x):
    a, b = x.chunk(2, dim=-1)
    return silu_and_mul(a, b)

"""Forward-replacement layers for HuggingFace modules, following the ``kernels`` layer rules.

Each class subclasses ``nn.Module`` with no ``__init__`` and no state of its own: its
``forward`` reads the attributes of the module whose forward it replaces (``weight``,
``variance_epsilon`` or ``eps``, ``proj``), with the same signature. So the HF ``kernels``
package can swap them in with ``kernelize`` (from a Hub or local export of this library, see
``ltx-kernels export-hub``), and they also serve directly, e.g.
``module.forward = types.MethodType(RMSNorm.forward, module)``.

``can_torch_compile = True``: every op has a Meta implementation and traces without graph
breaks. ``has_backward = True``: every op these layers call has a backward (registered
``<op>_backward`` ops; tests/python/test_backward.py), so ``kernelize`` may use them for training.

The norms and ``LinearGeluTanh`` run the forwards that ``ltx_kernels.diffusers.inject`` and
``ltx_kernels.transformers.apply`` patch the same modules with (:mod:`ltx_kernels._forwards`):
one fused op (fp32 math, one rounding), no further from fp32 than the stock forward, also
with a weight in fp32 beside a 16-bit input, in the stock forward's output dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from . import _forwards, ops


class RMSNorm(nn.Module):
    """transformers' RMSNorm (Llama, Mistral, Qwen2/3, ...): ``rms_norm(x, weight, eps)``."""

    can_torch_compile = True
    has_backward = True
    forward = _forwards.rms_norm_forward


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``rms_norm(x) * (1 + weight)`` in fp32, rounded once to ``x``'s dtype."""

    can_torch_compile = True
    has_backward = True
    forward = _forwards.gemma_rms_norm_forward


class DiffusersRMSNorm(nn.Module):
    """diffusers' RMSNorm: optional ``weight`` (``elementwise_affine=False`` has none) and ``bias``."""

    can_torch_compile = True
    has_backward = True
    forward = _forwards.rms_norm_forward


class SiluAndMul(nn.Module):
    """``silu(x[..., :H]) * x[..., H:]`` for ``x`` of ``[..., 2H]`` (vLLM's convention)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return ops.silu_and_mul(gate, up)


class GeluAndMul(nn.Module):
    """``gelu(x[..., :H]) * x[..., H:]``, exact (erf) GELU."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return ops.gelu_and_mul(gate, up)


class GeluTanhAndMul(nn.Module):
    """``gelu_tanh(x[..., :H]) * x[..., H:]``."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return ops.gelu_tanh_and_mul(gate, up)


class GeluTanh(nn.Module):
    """GELU with the tanh approximation (transformers' ``GELUTanh``, ``gelu_pytorch_tanh``)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return ops.gelu_tanh(input)


class LinearGeluTanh(nn.Module):
    """diffusers' ``GELU(approximate="tanh")`` (the FeedForward input of LTX-Video, PixArt, ...):
    ``gelu_tanh(proj(x))`` with the GELU in the GEMM's epilogue (``linear_gelu_tanh``)."""

    can_torch_compile = True
    has_backward = True
    forward = _forwards.linear_gelu_tanh_forward

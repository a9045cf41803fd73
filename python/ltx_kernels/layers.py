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

Mixed dtypes (a weight kept in fp32 under a bf16 model) compute what the stock module
computes, dtype promotion included; matching dtypes run one fused op (fp32 math, one
rounding), no further from fp32 than the stock forward.
"""

from __future__ import annotations

import torch
from torch import nn

from . import ops

_HALF = (torch.float16, torch.bfloat16)


def eps_of(module: nn.Module) -> float:
    """The module's epsilon, checked: a layer's scalar comes from the module whose forward it
    replaces, so the message names that module's class and attribute."""
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if value is not None:
            return ops._real(type(module).__name__, name, value, minimum=0.0)
    raise AttributeError(f"{type(module).__name__} has neither `variance_epsilon` nor `eps`")


class RMSNorm(nn.Module):
    """transformers' RMSNorm (Llama, Mistral, Qwen2/3, ...): ``weight * rms_norm(x)``.

    Mixed dtypes: like Llama, the normalized ``x`` is rounded to its dtype, then multiplied by
    ``weight`` with type promotion.
    """

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight.dtype != hidden_states.dtype:
            return weight * ops.rms_norm(hidden_states, None, eps_of(self))
        return ops.rms_norm(hidden_states, weight, eps_of(self))


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``rms_norm(x) * (1 + weight)`` in fp32, rounded once to ``x``'s dtype."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight.dtype != x.dtype:
            return ops.rms_norm(x.float(), weight.float(), eps_of(self), weight_offset=1.0).to(x.dtype)
        return ops.rms_norm(x, weight, eps_of(self), weight_offset=1.0)


class DiffusersRMSNorm(nn.Module):
    """diffusers' RMSNorm: optional ``weight`` (``elementwise_affine=False`` has none) and ``bias``.

    Mixed dtypes: like diffusers, the output takes a half-precision weight's dtype, else fp32.
    """

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight, bias, eps = self.weight, getattr(self, "bias", None), eps_of(self)
        if weight is not None and weight.dtype != hidden_states.dtype:
            out_dtype = weight.dtype if weight.dtype in _HALF else torch.float32
            out = ops.rms_norm(hidden_states.float(), weight.float(), eps).to(out_dtype)
        else:
            out = ops.rms_norm(hidden_states, weight, eps)
        return out if bias is None else out + bias


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

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        proj = self.proj
        if proj.bias is None or proj.weight.dtype != hidden_states.dtype:
            return ops.gelu_tanh(proj(hidden_states))
        return ops.linear_gelu_tanh(hidden_states, proj.weight, proj.bias)

"""Functional API: thin wrappers over ``torch.ops.ltx_kernels``.

Every op takes float32, float16 or bfloat16 tensors whose last dim is contiguous (rows may
be strided, e.g. a slice of a fused projection), computes in fp32 and rounds once on store.
Outputs are new contiguous tensors of the input's shape and dtype.
"""

from __future__ import annotations

import torch

_ops = torch.ops.ltx_kernels


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps) * (weight + weight_offset)``.

    ``weight`` is optional (diffusers' ``RMSNorm(elementwise_affine=False)`` has none);
    ``weight_offset=1.0`` gives Gemma's ``(1 + weight)``.
    """
    return _ops.rms_norm(x, weight, eps, weight_offset)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rms_norm(h), h)`` with ``h = x + residual`` rounded to the input dtype.

    The norm is computed from the same rounded ``h`` that is returned, as a decoder layer
    that adds the residual and then normalizes would.
    """
    return _ops.fused_add_rms_norm(x, residual, weight, eps, weight_offset)


def fused_add_rms_norm_(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
) -> torch.Tensor:
    """In-place :func:`fused_add_rms_norm`: ``residual`` becomes ``x + residual``; returns the norm."""
    return _ops.fused_add_rms_norm_(x, residual, weight, eps, weight_offset)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last dim (biased variance)."""
    return _ops.layer_norm(x, weight, bias, eps)


# Names of the original ltx_kernels package, kept so code written against it keeps working.


def rmsnorm(input: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """Old name of :func:`rms_norm`."""
    return rms_norm(input, weight, eps)


def rmsnorm_residual(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Old name of :func:`fused_add_rms_norm`: returns ``(out, residual_out)``."""
    return fused_add_rms_norm(input, residual, weight, eps)

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


def adaln_rms_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """AdaLN modulation of an RMS norm: ``rms_norm(x, weight, eps) * (1 + scale) + shift``.

    ``x`` is ``[B, S, D]`` (any ``[B, ..., D]``; a 2-dim ``x`` is one batch of tokens).
    ``scale`` and ``shift`` broadcast over rows as ``[D]``, per batch ``[B, 1, D]``, or per
    token with ``x``'s shape; they may be strided views (e.g. unbound from a ``[B, S, 6, D]``
    tensor, as LTX-Video does) and are read in place. One fp32 pass, rounded once.
    """
    return _ops.adaln_rms_norm(x, scale, shift, weight, eps)


def adaln_layer_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``layer_norm(x, weight, bias, eps) * (1 + scale) + shift``; broadcasting as
    :func:`adaln_rms_norm`."""
    return _ops.adaln_layer_norm(x, scale, shift, weight, bias, eps)


def gated_residual_adaln_rms_norm(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A DiT block's residual update fused with the next norm and modulation.

    Returns ``(x_new, normed)`` with ``x_new = x + y * gate`` (``gate=None`` means 1; fp32
    math, rounded to the input dtype) and ``normed = adaln_rms_norm(x_new, scale, shift,
    weight, eps)`` computed from that rounded ``x_new``. ``gate`` broadcasts like ``scale``.
    """
    return _ops.gated_residual_adaln_rms_norm(x, y, gate, scale, shift, weight, eps)


# Names of the original ltx_kernels package, kept so code written against it keeps working.


def rmsnorm(input: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """Old name of :func:`rms_norm`."""
    return rms_norm(input, weight, eps)


def rmsnorm_residual(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Old name of :func:`fused_add_rms_norm`: returns ``(out, residual_out)``."""
    return fused_add_rms_norm(input, residual, weight, eps)

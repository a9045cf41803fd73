"""One forward per kind of module, shared by the diffusers and transformers integrations and
the Kernels Hub layers (:mod:`ltx_kernels.layers`), so that each kind computes the same way
wherever it is patched.

Each reads the module's own attributes at call time, as the stock forward does (``weight``,
``eps`` / ``variance_epsilon``, ``proj``), so ``.to()``, hooks and changed attributes apply.

One mixed-precision policy for the norms: the kernels read a weight (and bias) in the input's
dtype or in float32 (a weight kept in fp32 under a 16-bit model) and write the output in the
input's dtype or in float32, so each module's stock output dtype comes out of one kernel call;
a weight in a third dtype is widened to float32 first (exact, one [D] copy), and an output
dtype the kernels do not write (a 16-bit weight's, beside an input of another dtype) is cast
from their float32 result. A library's tensor subclass (a torchao-quantized weight) runs the
module's own computation for that call.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from . import _fp8, ops
from ._patching import call_fused, is_library_tensor


def eps_of(module: nn.Module, dtype: torch.dtype | None = None) -> float:
    """The module's epsilon, checked: ``variance_epsilon`` (transformers) or ``eps``. For a
    ``torch.nn.RMSNorm`` with ``eps=None``, torch's default: the machine epsilon of ``dtype``
    (the input's). The message of a bad value names the module's class and attribute."""
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if value is not None:
            return ops._real(type(module).__name__, name, value, minimum=0.0)
    if dtype is not None and isinstance(module, nn.RMSNorm):
        return torch.finfo(dtype).eps
    raise AttributeError(f"{type(module).__name__} has neither `variance_epsilon` nor `eps`")


def _kernel_params(x: torch.Tensor, *params: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Weights as the norm kernels read them: in ``x``'s dtype or float32 as they are, another
    dtype widened to float32 (exact)."""
    return [p if p is None or p.dtype in (x.dtype, torch.float32) else p.float() for p in params]


def _rms_norm(module: nn.Module, x: torch.Tensor, weight_offset: float, dtype: torch.dtype) -> torch.Tensor:
    """``rms_norm`` with the module's weight and eps, in ``dtype`` (the stock forward's output
    dtype), plus the module's ``bias`` where it has one (diffusers' ``RMSNorm(bias=True)``)."""
    if is_library_tensor(module.weight):
        return type(module).forward(module, x)
    if x.stride(-1) != 1:  # e.g. a channels-last view in a VAE
        x = x.contiguous()
    (weight,) = _kernel_params(x, module.weight)
    out_dtype = dtype if dtype in (x.dtype, torch.float32) else torch.float32
    out = ops.rms_norm(x, weight, eps_of(module, x.dtype), weight_offset=weight_offset, out_dtype=out_dtype)
    out = out.to(dtype)
    bias = getattr(module, "bias", None)
    return out if bias is None else out + bias


def _rms_norm_dtype(module: nn.Module, x: torch.Tensor) -> torch.dtype:
    """The output dtype of the stock RMS norm forward, where weight and input dtypes differ."""
    weight = module.weight
    if weight is None or isinstance(module, nn.RMSNorm):
        return x.dtype  # torch.nn.functional.rms_norm; diffusers' RMSNorm without weight
    if hasattr(module, "variance_epsilon"):  # transformers: weight * normalized.to(x.dtype)
        return torch.promote_types(weight.dtype, x.dtype)
    return weight.dtype  # diffusers: normalized cast to a 16-bit weight's dtype, fp32 times an fp32 one


def rms_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """An RMS norm's forward, ``rms_norm(x, weight, eps)`` (+ ``bias`` where the module has
    one): transformers' ``<Family>RMSNorm``, diffusers' ``RMSNorm``, ``torch.nn.RMSNorm``."""
    return _rms_norm(self, hidden_states, 0.0, _rms_norm_dtype(self, hidden_states))


def gemma_rms_norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Gemma's RMS norm, ``rms_norm(x) * (1 + weight)`` (``weight_offset=1``), in ``x``'s
    dtype as stock (``.type_as(x)``)."""
    return _rms_norm(self, x, 1.0, x.dtype)


def layer_norm_forward(self: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """``torch.nn.LayerNorm`` over the last dim (``normalized_shape`` of one size; checked when
    patched): ``layer_norm(x, weight, bias, eps)``, in ``x``'s dtype as stock."""
    if is_library_tensor(self.weight) or is_library_tensor(self.bias):
        return type(self).forward(self, x)
    if x.stride(-1) != 1:
        x = x.contiguous()
    return ops.layer_norm(x, *_kernel_params(x, self.weight, self.bias), eps_of(self))


def linear_gelu_tanh(proj: nn.Module, x: torch.Tensor, unfused: Callable[[], torch.Tensor],
                     hooked: tuple[nn.Module, ...] = ()) -> torch.Tensor:
    """``gelu_tanh(proj(x))`` as one ``linear_gelu_tanh`` reading ``proj``'s parameters, run
    between the hooks of ``proj`` and ``hooked`` (:func:`~ltx_kernels._patching.call_fused`);
    ``unfused()`` where ``proj`` is not a plain ``nn.Linear`` with a bias in ``x``'s dtype
    (a peft LoRA layer, our FP8 linear, autocast) or a hook must see the call. A LoRA added
    around one of our FP8 linears raises (:func:`~ltx_kernels._fp8.check_adapters`)."""
    _fp8.check_adapters((proj,))
    if type(proj) is not nn.Linear or proj.bias is None or proj.weight.dtype != x.dtype:
        return unfused()
    return call_fused((proj, *hooked), lambda: ops.linear_gelu_tanh(x, proj.weight, proj.bias), unfused)


def linear_gelu_tanh_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """diffusers' ``GELU(approximate="tanh")``: its projection with the GELU in the GEMM's
    epilogue; unfused, the projection called as a module, then ``gelu_tanh``."""
    proj = self.proj
    return linear_gelu_tanh(proj, hidden_states, lambda: ops.gelu_tanh(proj(hidden_states)))

"""Instance-level forward patching shared by the diffusers and transformers integrations.

A patch replaces one module instance's ``forward`` (never its class, so other instances and
other models are untouched) and remembers what was there, so ``unpatch`` restores it exactly.

accelerate's hooks (``enable_model_cpu_offload``, ``enable_sequential_cpu_offload``,
``device_map``) wrap ``module.forward`` and call ``module._old_forward`` inside the wrapper;
a patch made after the hook goes into ``_old_forward`` so the hook keeps running around it, and
a hook added after the patch wraps the patched forward. Either way ``unpatch`` finds the
patched method wherever it ended up.
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

_STATE = "_ltx_kernels_patch"
_SLOTS = ("_old_forward", "forward")
_ABSENT = object()  # an attribute the patch added rather than replaced
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DEVICES = ("cuda", "cpu", "meta")


def is_patched(module: nn.Module) -> bool:
    return _STATE in module.__dict__


def patch(module: nn.Module, forward: Callable | None = None, **attributes) -> None:
    """Makes ``module(...)`` run ``forward(module, ...)`` (unless ``forward`` is None) and sets
    ``attributes`` on the module (e.g. an attention processor); :func:`unpatch` restores both."""
    if is_patched(module):
        raise RuntimeError(f"{type(module).__name__} is already patched by ltx_kernels")
    slot = "_old_forward" if hasattr(module, "_hf_hook") and "_old_forward" in module.__dict__ else "forward"
    saved = {name: getattr(module, name, _ABSENT) for name in attributes}
    module.__dict__[_STATE] = (forward, module.__dict__.get(slot), saved)
    if forward is not None:
        setattr(module, slot, types.MethodType(forward, module))
    for name, value in attributes.items():
        setattr(module, name, value)


def unpatch(module: nn.Module) -> bool:
    """Restores what :func:`patch` replaced; returns False if it was not patched."""
    state = module.__dict__.pop(_STATE, None)
    if state is None:
        return False
    forward, original, saved = state
    for slot in _SLOTS if forward is not None else ():
        bound = module.__dict__.get(slot)
        if getattr(bound, "__func__", None) is not forward:
            continue
        if original is not None:
            module.__dict__[slot] = original
        elif slot == "forward":
            del module.__dict__["forward"]
        else:  # under an accelerate hook that was added after the patch
            module._old_forward = types.MethodType(type(module).forward, module)
    for name, value in saved.items():
        if value is _ABSENT:
            delattr(module, name)
        else:
            setattr(module, name, value)
    return True


def call_with_parameters(modules: tuple[nn.Module, ...], fn: Callable[[], object]):
    """Returns ``fn()``, run while ``modules`` hold their parameters on the execution device.

    A fused kernel reads the weights of modules whose forward it replaces without calling them
    (e.g. ``norm_q.weight``). Under ``enable_sequential_cpu_offload`` those weights live off
    the device until the module's accelerate hook brings them in, so the hook is run around
    ``fn``, which must read the weights itself. Without hooks (and under torch.compile) this
    is just ``fn()``.
    """
    hooked = [m for m in modules if getattr(m, "_hf_hook", None) is not None]
    for m in hooked:
        m._hf_hook.pre_forward(m)
    try:
        return fn()
    finally:
        for m in hooked:
            m._hf_hook.post_forward(m, None)


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model``'s parameters cannot run our ops (device or dtype), or None."""
    tensors = list(model.parameters()) + list(model.buffers())
    devices = {t.device.type for t in tensors} - set(_DEVICES)
    if devices:
        return f"parameters on {sorted(devices)}; ltx_kernels runs on CUDA (and CPU)"
    dtypes = {t.dtype for t in tensors if t.is_floating_point()} - set(_DTYPES)
    if dtypes:
        return f"parameters in {sorted(map(str, dtypes))}; ltx_kernels takes fp32, fp16 and bf16"
    return None


@dataclass
class Report:
    """What an integration patched (counts per kind) and what it left alone, with why."""

    patched: Counter = field(default_factory=Counter)
    skipped: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"ltx_kernels patched {sum(self.patched.values())} modules:"]
        lines += [f"  {kind}: {count}" for kind, count in sorted(self.patched.items())]
        lines += [f"  not patched: {reason}" for reason in self.skipped]
        return "\n".join(lines)


def unpatch_all(model: nn.Module) -> int:
    """Unpatches every module under ``model``; returns how many were restored."""
    return sum(unpatch(m) for m in model.modules())

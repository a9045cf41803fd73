"""Instance-level forward patching shared by the diffusers and transformers integrations.

A patch replaces one module instance's forward (never its class, so other instances and
other models are untouched) and remembers what was there, so ``unpatch`` restores it.

What a patch replaces is the *base* forward, the one beneath every hook on the module:
- diffusers' ``HookRegistry`` (``diffusers/hooks/hooks.py``: cache methods, layerwise
  casting, group offloading) sets ``module.forward`` to a wrapper that calls, through a
  ``HookFunctionReference``, the previous forward: ``fn_ref.forward``, or
  ``fn_ref.original_forward`` for a hook with ``new_forward`` (which calls it itself);
- accelerate (``enable_model_cpu_offload``, ``enable_sequential_cpu_offload``,
  ``device_map``) sets ``module.forward`` to a wrapper that calls ``module._old_forward``.
Hooks added before the patch keep running around it and hooks added after wrap it, in any
order and nesting; ``unpatch`` follows the same chain to find the patched forward and
restores the stock one there. Whatever the user put there after the patch (a forward or an
attribute) is theirs and stays.
"""

from __future__ import annotations

import functools
import re
import sys
import types
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ._ops import ops as _ops

_STATE = "_ltx_kernels_patch"
_ABSENT = object()  # an attribute the patch added rather than replaced
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DEVICES = ("cuda", "cpu", "meta")
_PLAIN_TENSORS = (torch.Tensor, nn.Parameter)


def _is_registry_wrapper(forward) -> bool:
    """Whether ``forward`` is the wrapper diffusers' ``HookRegistry.register_hook`` puts on a
    module: ``functools.partial(new_forward, module)``, ``new_forward`` a closure over the
    hook's ``HookFunctionReference``."""
    func = getattr(forward, "func", None)
    return func is not None and getattr(func, "__module__", None) == "diffusers.hooks.hooks"


def _unwrap(module: nn.Module) -> tuple[tuple[dict, str], list]:
    """Follows ``module.forward`` through the hook wrappers down to the base forward.

    Returns the slot that holds the base forward, as (namespace dict, key): the module's
    ``__dict__`` (``"forward"`` absent when no hook or patch is there: the class's forward,
    or ``"_old_forward"``) or a ``HookFunctionReference``'s; and the hooks passed on the way,
    outermost first: each a ``HookFunctionReference`` or an accelerate hook, both with
    ``pre_forward(module, ...)`` and ``post_forward(module, output)``.

    The k-th registry wrapper from the outside belongs to the k-th last reference of the
    module's registry (``_fn_refs``, in registration order): each hook wraps the forward of
    its time, and removing one relinks its neighbours, so the order holds. (The wrapper's
    closure also holds its reference, but Dynamo cannot read a closure cell and then inline
    the closure: reading cells here broke ``torch.compile`` of a hooked module's call.)
    """
    namespace, key, hooks = module.__dict__, "forward", []
    registry = module.__dict__.get("_diffusers_hook")
    refs = registry._fn_refs[::-1] if registry is not None else []
    passed = 0  # registry wrappers passed
    while True:
        forward = namespace.get(key)
        if _is_registry_wrapper(forward) and passed < len(refs):
            fn_ref = refs[passed]
            passed += 1
            hooks.append(fn_ref)
            namespace, key = vars(fn_ref), "forward" if fn_ref.original_forward is None else "original_forward"
        elif (
            getattr(getattr(forward, "func", None), "__module__", None) == "accelerate.hooks"
            and "_old_forward" in module.__dict__
        ):
            hooks.append(module._hf_hook)
            namespace, key = module.__dict__, "_old_forward"
        else:
            return (namespace, key), hooks


def is_library_tensor(tensor: torch.Tensor | None) -> bool:
    """Whether ``tensor`` is a tensor subclass, whose ops belong to its library: torchao's
    quantized weights (``Int8Tensor``, ...), bitsandbytes' ``Int8Params``, GGUF parameters,
    ``DTensor``. No fused kernel reads one in place; the module holding it runs its forward."""
    return tensor is not None and type(tensor) not in _PLAIN_TENSORS


def is_library_owned(module: nn.Module) -> bool:
    """Whether one of ``module``'s own parameters is a library's tensor subclass."""
    return any(is_library_tensor(p) for p in module._parameters.values())


def library_owned_modules(model: nn.Module) -> str | None:
    """The modules of ``model`` that hold library tensors, as ``"name (count), ..."`` with the
    first index of a name folded into ``*`` (``transformer_blocks.*.attn1.to_q (28)``) and
    the tensor types, or None when there are none."""
    patterns: Counter = Counter()
    kinds = set()
    for name, module in model.named_modules():
        if is_library_owned(module):
            patterns[re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", name, count=1)] += 1
            kinds |= {type(p).__name__ for p in module._parameters.values() if is_library_tensor(p)}
    if not patterns:
        return None
    listed = ", ".join(f"{name} ({count})" if count > 1 else name for name, count in patterns.items())
    return f"{sum(patterns.values())} modules with {'/'.join(sorted(kinds))} parameters: {listed}"


def _method_function(forward):
    """The function of a bound method, or None. (Not ``getattr(forward, "__func__", None)``:
    Dynamo answers None for a method read from an object's ``__dict__``.)"""
    return forward.__func__ if isinstance(forward, types.MethodType) else None


def _is_class_forward(module: nn.Module, forward) -> bool:
    return forward is None or (_method_function(forward) is type(module).forward and forward.__self__ is module)


def is_patched(module: nn.Module) -> bool:
    return _STATE in module.__dict__


def _is_our_forward(module: nn.Module, forward) -> bool:
    """Whether ``forward`` is the forward our patch put there: a fused kernel that stands in
    for our own forward computes what it would (e.g. an FP8 linear's)."""
    return is_patched(module) and _method_function(forward) is module.__dict__[_STATE][0] is not None


def patch(module: nn.Module, forward: Callable | None = None, **attributes) -> None:
    """Makes ``module``'s base forward (beneath its hooks) ``forward(module, ...)`` (unless
    ``forward`` is None) and sets ``attributes`` on the module (e.g. an attention processor);
    :func:`unpatch` restores both."""
    if is_patched(module):
        raise RuntimeError(f"{type(module).__name__} is already patched by ltx_kernels")
    original = None
    if forward is not None:
        (namespace, key), _ = _unwrap(module)
        original = namespace.get(key)
        namespace[key] = types.MethodType(forward, module)
    saved = {}
    for name, value in attributes.items():
        saved[name] = (getattr(module, name, _ABSENT), value)
        setattr(module, name, value)
    module.__dict__[_STATE] = (forward, original, saved)


def unpatch(module: nn.Module) -> bool:
    """Restores what :func:`patch` replaced and is still there; returns False if it was not patched."""
    state = module.__dict__.pop(_STATE, None)
    if state is None:
        return False
    forward, original, saved = state
    if forward is not None:
        (namespace, key), _ = _unwrap(module)
        if _method_function(namespace.get(key)) is forward:
            if original is None:  # the class's forward, which hooks added since hold bound
                original = types.MethodType(type(module).forward, module)
            if namespace is module.__dict__ and key == "forward" and _is_class_forward(module, original):
                del namespace[key]  # no hook left: stock again, nothing in the instance dict
            else:
                namespace[key] = original
    for name, (old, ours) in saved.items():
        if getattr(module, name, _ABSENT) is not ours:
            continue  # set by the user after the patch (e.g. set_attn_processor): theirs stays
        if old is _ABSENT:
            delattr(module, name)
        else:
            setattr(module, name, old)
    return True


class ProcessorOverStock:
    """Base of our diffusers attention processors: each stands in for a stock one, whose
    attention backend and parallel config it reads and writes through, so that
    ``set_attention_backend`` (which sets ``processor._attention_backend``) reaches both and
    still holds after ``remove()``."""

    def __init__(self, stock) -> None:
        self._stock = stock

    @property
    def _attention_backend(self):
        return getattr(self._stock, "_attention_backend", None)

    @_attention_backend.setter
    def _attention_backend(self, backend) -> None:
        self._stock._attention_backend = backend

    @property
    def _parallel_config(self):
        return getattr(self._stock, "_parallel_config", None)

    @_parallel_config.setter
    def _parallel_config(self, config) -> None:
        self._stock._parallel_config = config


def runs_unhooked(module: nn.Module) -> bool:
    """Whether calling ``module`` would run its class's forward or our patch of it and nothing
    else: no forward set on the instance, no torch hooks, no library's tensor subclass."""
    forward = module.__dict__.get("forward")
    return ((forward is None or _is_our_forward(module, forward))
            and not module._forward_hooks and not module._forward_pre_hooks and not is_library_owned(module))


def attend(attn: nn.Module, *args, **kwargs):
    """``attn(*args, **kwargs)`` for a diffusers attention module whose forward hands its
    arguments (the processor's, by the same names) to its processor: the processor is called
    directly when the module runs unhooked (:func:`runs_unhooked`). Its forward filters keyword
    arguments with an ``inspect.signature`` of the processor on every call: host time an eager
    step pays once per attention (56 a LTX-Video 2B step, 288 an LTX-2 step)."""
    if not runs_unhooked(attn):
        return attn(*args, **kwargs)
    return attn.processor(attn, *args, **kwargs)


@functools.cache
def device_capability(index: int | None) -> tuple[int, int]:
    """A CUDA device's compute capability, read once per device: the forwards that pick a
    kernel by it run at every block's call (attention ~56 times an LTX step)."""
    return torch.cuda.get_device_capability(index)


def realized(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself; under torch.compile, a buffer of its own before slices of it feed our
    kernels. Inductor recomputes an unrealized pointwise result (an AdaLN table + timestep sum)
    in a kernel of its own for each slice that an op outside its codegen reads (4 kernels an LTX
    block where eager runs one add); an as_strided, a no-op view, makes it realize the whole once."""
    return t.as_strided(t.shape, t.stride()) if torch.compiler.is_compiling() else t


def call_fused(modules: tuple[nn.Module, ...], fused: Callable[[], object], unfused: Callable[[], object]):
    """``fused()``, a kernel that reads ``modules``' parameters in place of calling them
    (e.g. ``norm_q.weight``), run between the modules' hooks; or ``unfused()``, which calls
    the modules, where their hooks cannot run that way.

    Hooks that prepare parameters run around ``fused``: each ``pre_forward(module)``,
    outermost first, then ``post_forward(module, None)`` in reverse (accelerate's offload
    hooks; diffusers' layerwise casting, which casts fp8-stored weights to the compute dtype
    and back, and group offloading). They get the module alone: a fused kernel's inputs are
    activations already where it runs. A hook that replaces the forward (diffusers'
    ``new_forward``: caches, layer skip), torch forward hooks, or a forward the user set
    must see the module's own call, so ``unfused`` runs; so does a module holding a library's
    tensor subclass (:func:`is_library_tensor`: a torchao-quantized weight), which only its
    library computes with. A module whose base forward is our own patch counts as unhooked.
    Without hooks this is ``fused()`` after a look at each module's ``__dict__``, hook dicts
    and parameter types (what torch.compile traces); that holds for a module that is itself
    patched (its forward ours, with no hook around it: an FP8 linear, a transformers norm).
    """
    if all(runs_unhooked(m) for m in modules):
        return fused()
    runs = []
    for m in modules:
        (namespace, key), hooks = _unwrap(m)
        if (
            not (_is_class_forward(m, namespace.get(key)) or _is_our_forward(m, namespace.get(key)))
            or m._forward_hooks or m._forward_pre_hooks or is_library_owned(m)
            or any(getattr(hook, "original_forward", None) is not None for hook in hooks)
        ):
            return unfused()
        runs += [(m, hook) for hook in hooks]
    for m, hook in runs:
        hook.pre_forward(m)
    try:
        return fused()
    finally:
        for m, hook in reversed(runs):
            hook.post_forward(m, None)


def _compute_dtypes(model: nn.Module) -> dict[int, torch.dtype]:
    """{id(tensor): dtype} for tensors stored in one dtype and computed in another: those of
    modules under diffusers' layerwise casting hook (e.g. fp8 storage, bf16 compute), which
    casts them for each forward, fused reads included (:func:`call_fused`)."""
    casting = sys.modules.get("diffusers.hooks.layerwise_casting")
    if casting is None:
        return {}
    dtypes = {}
    for module in model.modules():
        registry = module.__dict__.get("_diffusers_hook")
        for hook in registry.hooks.values() if registry is not None else ():
            if isinstance(hook, casting.LayerwiseCastingHook):
                tensors = list(module.parameters()) + list(module.buffers())
                dtypes.update((id(t), hook.compute_dtype) for t in tensors if t.is_floating_point())
    return dtypes


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model``'s parameters cannot run our ops (device or dtype), or None."""
    tensors = list(model.parameters()) + list(model.buffers())
    devices = {t.device.type for t in tensors} - set(_DEVICES)
    if devices:
        return f"parameters on {sorted(devices)}; ltx_kernels runs on CUDA (and CPU)"
    compute = _compute_dtypes(model)
    dtypes = {compute.get(id(t), t.dtype) for t in tensors if t.is_floating_point()} - set(_DTYPES)
    if dtypes:
        return f"parameters in {sorted(map(str, dtypes))}; ltx_kernels takes fp32, fp16 and bf16"
    return None


@dataclass
class Report:
    """What an integration patched (counts per kind) and what it left alone, with why."""

    patched: Counter = field(default_factory=Counter)
    skipped: list[str] = field(default_factory=list)
    # What the user should know about the patched model (training support, weight memory).
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"ltx_kernels patched {sum(self.patched.values())} modules:"]
        lines += [f"  {kind}: {count}" for kind, count in sorted(self.patched.items())]
        lines += [f"  not patched: {reason}" for reason in self.skipped]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def note_training(self, model: nn.Module) -> None:
        """Says, for a model in train mode, which patched modules train (every op they name has
        a backward) and which are forward-only (they raise when an input requires grad, never a
        silent None gradient)."""
        if not (model.training and self.patched):
            return
        forward_only = sorted(kind for kind in self.patched if not _trains(kind))
        if forward_only:
            self.notes.append(
                f"{type(model).__name__} is in train mode; these patched modules are forward-only and raise "
                f"when an input requires grad: {'; '.join(forward_only)}. The others have a backward. Run "
                "inference under torch.no_grad(), or train the stock model (remove())."
            )
        else:
            self.notes.append(f"{type(model).__name__} is in train mode: every patched module has a backward.")


def nothing_to_patch(integration: str, message: str, strict: bool) -> Report:
    """inject's / apply's answer to a model they would change nothing in: ``message`` (which
    starts with the call's name) raised as a ValueError, or with ``strict=False`` warned from
    the caller's caller (the user's line) and an empty report returned."""
    if strict:
        raise ValueError(message)
    warnings.warn(f"ltx_kernels.{integration}.{message}; strict=False: nothing patched", stacklevel=3)
    return Report()


def _trains(kind: str) -> bool:
    """Whether a report kind's module has a backward: each of our ops it names in parentheses
    (e.g. 'RMSNorm (rms_norm)') has a registered ``<op>_backward``. A kind that names none runs
    torch ops and stock submodules only (SD3's joint-attention processor reorders them), which
    train as stock."""
    inside = " ".join(re.findall(r"\(([^)]*)\)", kind))
    named = [word for word in re.findall(r"[a-z0-9_]+", inside) if hasattr(_ops, word)]
    return all(hasattr(_ops, f"{word}_backward") for word in named)


def unpatch_all(model: nn.Module) -> int:
    """Unpatches every module under ``model``; returns how many were restored."""
    return sum(unpatch(m) for m in model.modules())

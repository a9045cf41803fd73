"""What a model-family module declares to its framework's registry."""

from __future__ import annotations

from typing import Callable, NamedTuple

from torch import nn

from ltx_kernels._patching import Report


class PatchOptions(NamedTuple):
    """The caller's choices a family may read (``inject``'s arguments)."""

    rope: str = "exact"


def _no_fused_modules(model: nn.Module) -> list[nn.Module]:
    return []


class Family(NamedTuple):
    """A model family: ``classes()`` imports and returns the model classes it handles (the
    framework is an optional dependency), ``patch(model, report, options)`` patches one instance
    (a second call patches nothing new), ``fused(model)`` lists the submodules whose forward
    the patched model computes inside fused ops (so nothing patches them by class)."""

    name: str
    classes: Callable[[], tuple[type, ...]]
    patch: Callable[[nn.Module, Report, PatchOptions], None]
    fused: Callable[[nn.Module], list[nn.Module]] = _no_fused_modules

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


def _no_projection_groups(model: nn.Module) -> list[tuple[nn.Module, ...]]:
    return []


class Family(NamedTuple):
    """A model family: ``classes()`` imports and returns the model classes it handles (the
    framework is an optional dependency), ``patch(model, report, options)`` patches one instance
    (a second call patches nothing new), ``fused(model)`` lists the submodules whose forward
    the patched model computes inside fused ops (so nothing patches them by class), and
    ``projection_groups(model)`` the groups of linears that its patched forward computes from
    one input in one call of :func:`ltx_kernels._fp8.linears` (e.g. a self-attention's q, k and
    v), in output order: under FP8 their weights are stored adjacent, so one GEMM computes a
    group. Only groups whose outputs the family's ops take as strided views belong there."""

    name: str
    classes: Callable[[], tuple[type, ...]]
    patch: Callable[[nn.Module, Report, PatchOptions], None]
    fused: Callable[[nn.Module], list[nn.Module]] = _no_fused_modules
    projection_groups: Callable[[nn.Module], list[tuple[nn.Module, ...]]] = _no_projection_groups

"""Classifier-free guidance parallelism: the two halves of a CFG batch on two ranks.

A diffusers pipeline with guidance runs its transformer on a batch of 2 (unconditional and
conditional) every step. ``enable_cfg_parallel(transformer)`` makes each rank of a process
group compute its share of that batch and all-gather the outputs, so that every rank returns
the whole batch's output, as one process would: with 2 GPUs, each step's transformer work is
halved. diffusers (0.42) has no such mechanism; its context parallelism
(``enable_parallelism(ContextParallelConfig(...))``) splits the sequence instead, and the two
compose: give this helper the CFG dimension's group of a 2-D device mesh and diffusers the other
dimension's mesh.

It is a diffusers model hook (``HookRegistry``): it composes with ``ltx_kernels.diffusers.inject``
in either order (our patches go beneath hooks) and with diffusers' other hooks. Every rank must
call the model with the same arguments (run the same pipeline with the same seed); the
collectives use the process group's timeout, after which a rank whose peer failed raises.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from diffusers.hooks import HookRegistry, ModelHook
from torch import nn

HOOK_NAME = "ltx_kernels_cfg_parallel"


def enable_cfg_parallel(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Splits ``model``'s batch over the ranks of ``group`` (default: the whole world): every
    tensor argument whose first dim is the batch of the first tensor argument (the latents,
    ``hidden_states``) is cut into equal consecutive shares, rank ``r`` computing share ``r``;
    every tensor of the output is gathered back. The batch must divide by the group's size."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("enable_cfg_parallel: torch.distributed must be initialized first "
                           "(torch.distributed.init_process_group, e.g. under torchrun)")
    registry = HookRegistry.check_if_exists_or_initialize(model)
    if registry.get_hook(HOOK_NAME) is not None:
        raise ValueError(f"enable_cfg_parallel: {type(model).__name__} already splits its batch over ranks")
    registry.register_hook(_CfgParallelHook(group), HOOK_NAME)


def disable_cfg_parallel(model: nn.Module) -> bool:
    """Removes :func:`enable_cfg_parallel`'s hook; returns whether there was one."""
    registry = getattr(model, "_diffusers_hook", None)
    if registry is None or registry.get_hook(HOOK_NAME) is None:
        return False
    registry.remove_hook(HOOK_NAME, recurse=False)
    return True


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor:
    found = kwargs.get("hidden_states")
    if found is None:
        found = next((a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.dim() > 0), None)
    if found is None:
        raise ValueError("enable_cfg_parallel: the model was called without a batched tensor argument")
    return found


class _CfgParallelHook(ModelHook):
    def __init__(self, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.group = group

    def pre_forward(self, module: nn.Module, *args, **kwargs):
        batch = _first_tensor(args, kwargs).size(0)
        ranks, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if batch % ranks:
            raise ValueError(
                f"enable_cfg_parallel: {type(module).__name__} got a batch of {batch}, which does not divide over "
                f"{ranks} ranks: CFG parallelism splits a batch with guidance (2 per prompt); run without "
                "guidance on one rank, or with a batch that divides")

        def share(value):
            if torch.is_tensor(value) and value.dim() > 0 and value.size(0) == batch:
                return value.chunk(ranks)[rank]
            return value

        return tuple(share(a) for a in args), {k: share(v) for k, v in kwargs.items()}

    def post_forward(self, module: nn.Module, output):
        if torch.is_tensor(output):
            return self._gather(output)
        if isinstance(output, (tuple, list)):
            return type(output)(self._gather(o) if torch.is_tensor(o) else o for o in output)
        # diffusers' BaseOutput (e.g. Transformer2DModelOutput): an ordered dict of its fields
        return type(output)(**{k: self._gather(v) if torch.is_tensor(v) else v for k, v in output.items()})

    def _gather(self, share: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(share) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, share.contiguous(), group=self.group)
        return torch.cat(parts)

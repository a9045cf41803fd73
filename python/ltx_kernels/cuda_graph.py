"""A model's forward replayed from CUDA graphs: the step without host launch overhead.

    import ltx_kernels.cuda_graph
    ltx_kernels.cuda_graph.capture(pipe.transformer)   # after inject() and any other change
    pipe(...)                                           # each step replays one graph
    ltx_kernels.cuda_graph.release(pipe.transformer)   # the plain forward again

An eager step launches each kernel from Python (an LTX-2B FP8 step: ~530 launches), and at short
videos the GPU waits for them: on an H100, LTX-2B FP8 at 49 frames took 30.3-45.8 ms a step
eagerly, depending on the host, and 28.8-29.0 ms replayed from one graph
(benchmarks/results/h100/pdl.md). ``capture`` puts a wrapper in the module's ``forward``: per
signature of its arguments (their structure as torch's pytree flattens it: tuples, lists, dicts;
each tensor's shape, dtype, device and strides; every other leaf's type and value), the first call runs the forward twice on a side stream (warm-up: workspaces,
cuBLAS handles) and records it into a CUDA graph over static copies of the tensor arguments; every
call copies its tensors into those, replays the graph and returns a copy of the outputs (so that a
caller may keep them across calls). A denoising loop with fixed sizes (a pipeline with CFG) thus
records one graph. The graphs share one memory pool.

What a graph holds fixed, and ``capture`` therefore requires: the parameters' storage (a change
of the weights in place shows, a replaced parameter does not: call ``capture`` again after
``inject``, LoRA loading or fusing, offloading changes), no autograd (the forward must run
under ``torch.no_grad()`` or inference mode, as pipelines call it), CUDA tensors, and other
argument values that are hashable (ints, floats, strings, None, in any nesting). Anything else raises a
ValueError naming the argument; nothing falls back to an eager call silently.
"""

from __future__ import annotations

import functools

import torch
import torch.utils._pytree as pytree
from torch import nn

_STATE = "_ltx_kernels_cuda_graph"


def _argument_name(path) -> str:
    """``args[0]``, ``encoder_hidden_states`` or ``attention_kwargs['scale']`` for a leaf's path
    in ``(args, kwargs)``."""
    in_args, where = path[0].idx == 0, path[1]
    return (f"args[{where.idx}]" if in_args else str(where.key)) + pytree.keystr(path[2:])


def _leaf_signature(value):
    """What a leaf of the arguments contributes to a call's key; None where it cannot key a
    graph (a CPU tensor, an unhashable value)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cuda":
            return None
        return (tuple(value.shape), value.dtype, value.device, value.stride())
    try:
        hash(value)
    except TypeError:
        return None
    return (type(value), value)  # (1, 1.0 and True are equal keys otherwise)


def _refuse(args: tuple, kwargs: dict):
    """Raises the ValueError that names the first argument which cannot key a graph."""
    for path, value in pytree.tree_flatten_with_path((args, kwargs))[0]:
        if _leaf_signature(value) is not None:
            continue
        name = _argument_name(path)
        if isinstance(value, torch.Tensor):
            raise ValueError(f"ltx_kernels.cuda_graph: argument '{name}' is on {value.device}: a CUDA graph "
                             "replays CUDA tensors only (move the inputs, or call release(module))")
        raise ValueError(f"ltx_kernels.cuda_graph: argument '{name}' ({type(value).__name__}) is neither a "
                         "tensor nor hashable: its value cannot key a recorded graph")


def _clone_tensors(value):
    """``value`` (any pytree: tuples, dicts, diffusers' output classes) with its tensors copied."""
    return pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, value)


class _Recorded:
    """One signature's graph: static copies of the tensor arguments, the graph, its outputs."""

    def __init__(self, forward, leaves: list, spec, pool):
        self.inputs = [v.clone() for v in leaves if isinstance(v, torch.Tensor)]
        static = iter(self.inputs)
        args, kwargs = pytree.tree_unflatten([next(static) if isinstance(v, torch.Tensor) else v for v in leaves],
                                             spec)
        side = torch.cuda.Stream(device=self.inputs[0].device if self.inputs else None)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazily made workspaces and handles, outside the graph
                forward(*args, **kwargs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = forward(*args, **kwargs)

    def __call__(self, tensors: list):
        if tensors:
            torch._foreach_copy_(self.inputs, tensors)  # (one launch for all, where they allow it)
        self.graph.replay()
        return _clone_tensors(self.outputs)


def capture(module: nn.Module) -> nn.Module:
    """Makes ``module``'s forward replay CUDA graphs, one per argument signature (see the
    module's documentation); returns ``module``. Again on a captured module: its graphs are
    dropped and recorded anew (after a change of its weights or patches)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"ltx_kernels.cuda_graph.capture: expected an nn.Module, got {type(module).__name__}")
    if not torch.cuda.is_available():
        raise RuntimeError("ltx_kernels.cuda_graph.capture: CUDA graphs need a CUDA GPU, and none is available")
    release(module)
    forward = module.forward
    graphs: dict = {}
    pool = torch.cuda.graph_pool_handle()

    @functools.wraps(forward)
    def replayed(*args, **kwargs):
        if torch.is_grad_enabled():
            raise RuntimeError("ltx_kernels.cuda_graph: a captured forward runs without autograd: call it under "
                               "torch.no_grad() or torch.inference_mode(), or call release(module) to train")
        kwargs = dict(sorted(kwargs.items()))  # (one order for the key and the tensors' copies)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        signature = tuple(_leaf_signature(v) for v in leaves)
        if None in signature:
            _refuse(args, kwargs)
        recorded = graphs.get((spec, signature))
        if recorded is None:
            recorded = graphs[(spec, signature)] = _Recorded(forward, leaves, spec, pool)
        return recorded([v for v in leaves if isinstance(v, torch.Tensor)])

    # (what release() restores: a forward set on the instance before, e.g. by a patch, or none)
    module.__dict__[_STATE] = module.__dict__.get("forward")
    module.forward = replayed
    return module


def release(module: nn.Module) -> bool:
    """Gives ``module`` back its forward (its graphs and their memory go with the wrapper);
    False if it was not captured."""
    if _STATE not in module.__dict__:
        return False
    own = module.__dict__.pop(_STATE)
    if own is None:
        del module.forward
    else:
        module.forward = own
    return True

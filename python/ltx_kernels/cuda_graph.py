"""A model's forward replayed from CUDA graphs: the step without host launch overhead.

    import ltx_kernels.cuda_graph
    ltx_kernels.cuda_graph.capture(pipe.transformer)   # after inject() and any other change
    pipe(...)                                           # each step replays one graph
    ltx_kernels.cuda_graph.release(pipe.transformer)   # the plain forward again

An eager step launches each kernel from Python (an LTX-2B FP8 step: ~530 launches), and at short
videos the GPU waits for them: on an H100, LTX-2B FP8 at 49 frames took 30.3-45.8 ms a step
eagerly, depending on the host, and 28.8-29.0 ms replayed from one graph
(benchmarks/results/h100/pdl.md). ``capture`` puts a wrapper in the module's ``forward``: per
signature of its arguments (each tensor's shape, dtype, device and strides, every other
argument's value), the first call runs the forward twice on a side stream (warm-up: workspaces,
cuBLAS handles) and records it into a CUDA graph over static copies of the tensor arguments; every
call copies its tensors into those, replays the graph and returns a copy of the outputs (so that a
caller may keep them across calls). A denoising loop with fixed sizes (a pipeline with CFG) thus
records one graph. The graphs share one memory pool.

What a graph holds fixed, and ``capture`` therefore requires: the parameters' storage (a change
of the weights in place shows, a replaced parameter does not: call ``capture`` again after
``inject``, LoRA loading or fusing, offloading changes), no autograd (the forward must run
under ``torch.no_grad()`` or inference mode, as pipelines call it), CUDA tensors, and argument
values that are hashable (ints, floats, strings, tuples, None). Anything else raises a
ValueError naming the argument; nothing falls back to an eager call silently.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

_STATE = "_ltx_kernels_cuda_graph"


def _signature(name: str, value):
    """The part of a call's key that ``value`` contributes (argument ``name``)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cuda":
            raise ValueError(f"ltx_kernels.cuda_graph: argument '{name}' is on {value.device}: a CUDA graph "
                             "replays CUDA tensors only (move the inputs, or call release(module))")
        return ("tensor", tuple(value.shape), value.dtype, value.device, value.stride())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_signature(f"{name}[{i}]", v) for i, v in enumerate(value)))
    try:
        hash(value)
    except TypeError:
        raise ValueError(f"ltx_kernels.cuda_graph: argument '{name}' ({type(value).__name__}) is neither a "
                         "tensor nor hashable: its value cannot key a recorded graph") from None
    return ("value", value)


def _tensors(value):
    """The tensors in ``value`` (nested tuples and lists), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _with_tensors(value, tensors):
    """``value`` with its tensors replaced by the next ones of the iterator ``tensors``."""
    if isinstance(value, torch.Tensor):
        return next(tensors)
    if isinstance(value, (tuple, list)):
        return type(value)(_with_tensors(v, tensors) for v in value)
    return value


def _copy_outputs(value):
    """The forward's outputs with each tensor copied out of the graph's pool."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_copy_outputs(v) for v in value)
    if dataclasses.is_dataclass(value):  # diffusers' output classes (return_dict=True)
        return type(value)(**{f.name: _copy_outputs(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, dict):
        return {k: _copy_outputs(v) for k, v in value.items()}
    return value


class _Recorded:
    """One signature's graph: static copies of the tensor arguments, the graph, its outputs."""

    def __init__(self, forward, args: tuple, kwargs: dict, pool):
        self.inputs = [t.clone() for t in _tensors((args, tuple(kwargs.values())))]
        static = iter(self.inputs)
        self.args = _with_tensors(args, static)
        self.kwargs = dict(zip(kwargs, _with_tensors(tuple(kwargs.values()), static)))
        side = torch.cuda.Stream(device=self.inputs[0].device if self.inputs else None)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazily made workspaces and handles, outside the graph
                forward(*self.args, **self.kwargs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = forward(*self.args, **self.kwargs)

    def __call__(self, args: tuple, kwargs: dict):
        for static, t in zip(self.inputs, _tensors((args, tuple(kwargs.values())))):
            static.copy_(t)
        self.graph.replay()
        return _copy_outputs(self.outputs)


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
        key = (_signature("args", args), tuple((k, _signature(k, v)) for k, v in kwargs.items()))
        recorded = graphs.get(key)
        if recorded is None:
            recorded = graphs[key] = _Recorded(forward, args, kwargs, pool)
        return recorded(args, kwargs)

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

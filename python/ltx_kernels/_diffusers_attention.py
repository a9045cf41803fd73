"""``ltx_kernels.attention`` as diffusers attention backends, and ``inject(..., attention=...)``.

Two backends of diffusers' attention dispatcher (``diffusers/models/attention_dispatch.py``),
registered when :mod:`ltx_kernels.diffusers` is imported (nothing happens without diffusers):

- ``"ltx_kernels"``: ``ltx_kernels.attention(precision="bf16")``, exact attention;
- ``"ltx_kernels_8bit"``: ``precision="8bit"``, SageAttention's method (q and k in INT8 with
  per-block scales, k smoothed by its mean over the keys), except for a long query sequence
  against few keys (at least ``MIN_TOKENS`` queries, at most ``ops.ATTENTION_SHORT_KEYS`` keys: a
  DiT's text cross-attention), which gets exact attention: the short-key kernel is faster there
  than the 8-bit method's passes and key-walking kernel (H100, LTX-2B 161 frames' 8064 queries x
  128 text keys: ~80 us against ~150 us, plus a 36 us pass over q in the build then measured).

Any model whose attention processors call ``dispatch_attention_fn`` selects them with diffusers'
own API (``model.set_attention_backend("ltx_kernels_8bit")``, ``with attention_backend(...)``)
or with ``inject(..., attention="bf16" | "8bit")``, which sets them per processor (see
:func:`use_backend`).

They take diffusers' ``[B, S, H, D]`` layout and call the op on transposed views (no copy),
with diffusers' mask semantics (those of its ``native`` backend: SDPA's, plus a ``[B, Sk]``
mask read as key padding). They refuse, with a ValueError naming the backend and the
argument, what the op does not compute: ``dropout_p > 0``, ``is_causal=True``,
``return_lse=True``, q and k head counts that differ without ``enable_gqa=True``, and on CUDA
anything but bf16/fp16 with head_dim 64 or 128. These checks run on every call: diffusers'
registry ``constraints`` only run with ``DIFFUSERS_ATTN_CHECKS=1``, so none are declared.
Differentiable: the op's backward is the exact attention's gradient (for the 8-bit backend too,
straight through its rounding), a composite of torch ops, not yet a fused kernel.

Context parallelism: diffusers has one flag for both of its kinds, and it is declared, for
Ulysses (an all-to-all of heads around a plain forward, which the backends run through
diffusers' own ``_templated_context_parallel_attention``). Ring attention merges per-shard
results by their log-sum-exp, which ``ltx_kernels.attention`` does not return: a ring degree
> 1 raises on the first call, and ``inject(..., attention=...)`` refuses such a model up front.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from . import ops
from ._ops import ops as _ops
from ._patching import Report, device_capability

# inject's attention= value -> backend name (and the op's precision of the same name).
BACKENDS = {"bf16": "ltx_kernels", "8bit": "ltx_kernels_8bit"}
# What the CUDA kernel runs (include/ltx_kernels/attention.h, cuda_support): checked here so the
# error names the backend and the way out; the CPU reference takes any head_dim and fp32 too.
_CUDA_DTYPES = (torch.bfloat16, torch.float16)
_CUDA_HEAD_DIMS = (64, 128)
# On a processor: (its backend before the first inject, the backend inject set).
_STATE = "_ltx_kernels_attention_backend"


def _op_mask(attn_mask, query, key):
    """diffusers' mask as the op reads it: a ``[B, Sk]`` key padding mask as ``[B, 1, 1, Sk]``
    (as diffusers' native backend reads it), anything else as it is."""
    if attn_mask is not None and attn_mask.ndim == 2 and attn_mask.shape == (query.shape[0], key.shape[1]):
        return attn_mask[:, None, None]
    return attn_mask


def _attend(query, key, value, attn_mask, scale, precision: str) -> torch.Tensor:
    """The op on ``[B, S, H, D]`` tensors, as ``[B, H, S, D]`` views; returns ``[B, S, H, D]``.
    The 8-bit method runs exact where :func:`exact_pays` (see the module's docstring)."""
    if precision == "8bit" and exact_pays(query, key):
        precision = "bf16"
    out = ops.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                        scale=scale, attn_mask=_op_mask(attn_mask, query, key), precision=precision)
    return out.transpose(1, 2)


# Where ltx_kernels.attention is faster than SDPA's fastest backend (H100, bf16, 2 x 32 heads:
# benchmarks/results/h100/attention.md, attention_short_keys.md), for :func:`processor_attention`:
# at least MIN_TOKENS query rows (fewer: launch overhead and a short grid, SDPA stays), and then
# either at most ops.ATTENTION_SHORT_KEYS keys (a DiT's text cross-attention: the short-key
# kernel, 1.13-1.30x cuDNN, from sm_80 on) or head dim 64 with no mask over at least MIN_TOKENS
# keys on Hopper with this build's sm_90a kernel (0.86-0.93x cuDNN at 64-1024 keys, 1.09x at
# 1536, 1.13-1.19x at 2688-31680). At head dim 128 cuDNN is the faster (ours 0.92-0.98x).
MIN_TOKENS = 1536


def exact_pays(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether an 8-bit call on these ``[B, S, H, D]`` inputs runs exact attention instead: a
    text cross-attention's shape (see the module's docstring), on every device alike, so that
    the CPU computes what a GPU does."""
    return key.size(1) <= ops.ATTENTION_SHORT_KEYS and query.size(1) >= MIN_TOKENS


def prefers_ours(query: torch.Tensor, key: torch.Tensor, attn_mask) -> bool:
    """Whether ltx_kernels.attention (exact) is the faster for these ``[B, S, H, D]`` inputs
    (see MIN_TOKENS)."""
    if (query.device.type != "cuda" or query.dtype not in _CUDA_DTYPES or query.size(-1) not in _CUDA_HEAD_DIMS
            or query.size(1) < MIN_TOKENS):
        return False
    capability = device_capability(query.device.index)
    if key.size(1) <= ops.ATTENTION_SHORT_KEYS:
        return capability >= (8, 0)
    return (query.size(-1) == 64 and attn_mask is None and key.size(1) >= MIN_TOKENS and capability[0] == 9
            and ops.SM90A_KERNELS)


def processor_attention(processor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask=None,
                        parallel: bool = True) -> torch.Tensor:
    """The attention of one of our processors, ``[B, S, H, D]`` in and out, in every integrated
    family: ltx_kernels.attention (exact) where nobody chose a backend (neither the processor
    nor an active one other than diffusers' default, the native SDPA), without context
    parallelism, where no gradient flows through it (a training forward, LoRA fine-tuning,
    keeps SDPA, whose fused backward is faster than the op's composite one) and where
    :func:`prefers_ours`; otherwise diffusers' dispatcher with the processor's backend and, when
    ``parallel``, its context-parallel config, as the stock processor calls it."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, dispatch_attention_fn

    parallel_config = processor._parallel_config if parallel else None
    needs_grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    if (not needs_grad and processor._attention_backend is None and parallel_config is None
            and _AttentionBackendRegistry.get_active_backend()[0] == AttentionBackendName.NATIVE
            and prefers_ours(query, key, attn_mask)):
        return _attend(query, key, value, attn_mask, None, "bf16")
    return dispatch_attention_fn(query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=False,
                                 backend=processor._attention_backend, parallel_config=parallel_config)


def _check(name: str, query, key, dropout_p, is_causal, enable_gqa, return_lse) -> None:
    if dropout_p != 0.0:
        raise ValueError(f"attention backend '{name}': dropout_p must be 0 (no dropout in ltx_kernels.attention), "
                         f"got {dropout_p}")
    if is_causal:
        raise ValueError(f"attention backend '{name}': is_causal=True is not supported (ltx_kernels.attention is "
                         "non-causal; pass a mask as attn_mask)")
    if return_lse:
        raise ValueError(f"attention backend '{name}': return_lse=True is not supported (ltx_kernels.attention does "
                         "not return the log-sum-exp, which ring attention needs)")
    if query.shape[2] != key.shape[2] and not enable_gqa:
        raise ValueError(f"attention backend '{name}': query has {query.shape[2]} heads and key {key.shape[2]}: "
                         "pass enable_gqa=True for grouped-query attention")
    if query.is_cuda and (query.dtype not in _CUDA_DTYPES or query.shape[-1] not in _CUDA_HEAD_DIMS):
        raise ValueError(
            f"attention backend '{name}': on CUDA, query, key and value must be bfloat16 or float16 with head_dim "
            f"{' or '.join(map(str, _CUDA_HEAD_DIMS))}, got {query.dtype} with head_dim {query.shape[-1]}: run this "
            "model with another backend "
            "(model.set_attention_backend(...), or inject(..., attention=None))"
        )


def _forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None, *, precision: str):
    """What diffusers' context-parallel template calls on each rank (Ulysses: every token of
    1 / degree of the heads, gathered by an all-to-all); the backend function checked the
    arguments. Saves what ``_backward_op`` needs when asked to."""
    if _save_ctx:
        ctx.save_for_backward(query, key, value)
        ctx.attn_mask, ctx.scale = attn_mask, scale
    return _attend(query, key, value, attn_mask, scale, precision)


def _backward_op(ctx, grad_out, *args, precision: str, **kwargs):
    """The gradients of ``_forward_op``'s query, key and value (``[B, S, H, D]``), from the op's
    backward (the exact attention's gradient, for both precisions)."""
    query, key, value = ctx.saved_tensors
    mask = _op_mask(ctx.attn_mask, query, key)
    grads = _ops.attention_backward(grad_out.transpose(1, 2), query.transpose(1, 2), key.transpose(1, 2),
                                    value.transpose(1, 2), mask, ctx.scale, precision)
    return tuple(g.transpose(1, 2) for g in grads[:3])


def _backend_function(precision: str):
    name = BACKENDS[precision]

    # The parameter names are what the dispatcher passes (it filters its arguments by them).
    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, return_lse=False, _parallel_config=None):
        _check(name, query, key, dropout_p, is_causal, enable_gqa, return_lse)
        if _parallel_config is None:
            return _attend(query, key, value, attn_mask, scale, precision)
        if _parallel_config.context_parallel_config.ring_degree > 1:
            raise ValueError(f"attention backend '{name}': ring attention (ring_degree > 1) is not supported: it "
                             "merges shards by their log-sum-exp, which ltx_kernels.attention does not return. "
                             "Use Ulysses (ulysses_degree) alone.")
        from diffusers.models.attention_dispatch import _templated_context_parallel_attention

        return _templated_context_parallel_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
            forward_op=functools.partial(_forward_op, precision=precision),
            backward_op=functools.partial(_backward_op, precision=precision),
            _parallel_config=_parallel_config,
        )

    attention.__name__ = attention.__qualname__ = f"{name}_attention"
    return attention


def _backend_name(value: str):
    """The ``AttentionBackendName`` member of ``value``, added if absent.

    diffusers parses backend names with this closed Enum in ``set_attention_backend``,
    ``attention_backend(...)`` and ``dispatch_attention_fn`` and offers no way to extend it, so
    the member is added as the Enum metaclass adds one: an instance of the class with its
    name and value, in the class's member maps and as its attribute."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    member = AttentionBackendName._value2member_map_.get(value)
    if member is None:
        member = str.__new__(AttentionBackendName, value)
        member._name_, member._value_ = value.upper(), value
        member.__objclass__ = AttentionBackendName
        member._sort_order_ = len(AttentionBackendName._member_names_)
        setattr(AttentionBackendName, member._name_, member)
        AttentionBackendName._member_names_.append(member._name_)
        AttentionBackendName._member_map_[member._name_] = member
        AttentionBackendName._value2member_map_[value] = member
    return member


def register() -> bool:
    """Registers both backends with diffusers' dispatcher (again: the same entries); False when
    diffusers or its dispatcher (diffusers >= 0.35) is not installed."""
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry
    except ImportError:
        return False
    for precision, name in BACKENDS.items():
        _AttentionBackendRegistry.register(_backend_name(name), supports_context_parallel=True)(
            _backend_function(precision)
        )
    return True


def _attention_modules(model: nn.Module):
    """(name, module) of the attention modules that ``set_attention_backend`` walks."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention, MochiAttention

    classes = (Attention, MochiAttention, AttentionModuleMixin)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, classes)]


def _dispatched(module: nn.Module) -> bool:
    """Whether the module's processor calls ``dispatch_attention_fn`` with its own backend."""
    return module.processor is not None and hasattr(module.processor, "_attention_backend")


def takes_backend(model: nn.Module) -> bool:
    """Whether ``model`` has an attention processor that :func:`use_backend` would set."""
    return any(_dispatched(module) for _, module in _attention_modules(model))


def check_arguments(attention, registered: bool) -> None:
    if attention is not None and attention not in tuple(BACKENDS):  # a tuple: an unhashable value fails here too
        raise ValueError(f"inject: attention must be None, 'bf16' or '8bit', got {attention!r}")
    if attention is not None and not registered:
        raise RuntimeError("inject: attention= needs diffusers' attention dispatcher "
                           "(diffusers.models.attention_dispatch, diffusers >= 0.35), which is not installed")


def check_model(model: nn.Module, attention) -> None:
    """Refuses, before anything changes, a model that runs ring attention (see the module doc)."""
    if attention is None:
        return
    for name, module in _attention_modules(model):
        config = getattr(module.processor, "_parallel_config", None)
        cp = getattr(config, "context_parallel_config", None)
        if cp is not None and cp.ring_degree > 1:
            raise ValueError(f"inject: attention={attention!r} cannot run {type(model).__name__}.{name}: its context "
                             f"parallelism has ring_degree {cp.ring_degree}, and ring attention needs the "
                             "log-sum-exp, which ltx_kernels.attention does not return (Ulysses alone works)")


def use_backend(model: nn.Module, attention: str, report: Report) -> None:
    """Sets the ``attention`` backend on every attention processor of ``model`` that goes
    through diffusers' dispatcher, remembering on the processor what it had, for
    :func:`restore_backends`.

    Per processor, as ``set_attention_backend`` does it, but without its other effect: that also
    makes the backend the process-wide default of every model whose processors have none.
    A backend the user set before is replaced (said in ``report.notes``); modules whose
    processor computes attention itself are listed in ``report.skipped``."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    backend = AttentionBackendName(BACKENDS[attention])
    model_name = type(model).__name__
    replaced, not_dispatched = {}, {}
    for _, module in _attention_modules(model):
        processor = module.processor
        if not _dispatched(module):
            kind = type(processor).__name__
            not_dispatched[kind] = not_dispatched.get(kind, 0) + 1
            continue
        current, state = processor._attention_backend, processor.__dict__.get(_STATE)
        if state is not None and current == state[1]:  # as an earlier inject left it
            if current == backend:
                continue  # nothing new
            previous = state[0]  # what remove() restores stays what the model had before it
        else:  # None (the process-wide default) or the user's backend
            previous = current
            if current is not None and current != backend:
                key = getattr(current, "value", current)
                replaced[key] = replaced.get(key, 0) + 1
        processor._attention_backend = backend
        processor.__dict__[_STATE] = (previous, backend)
        report.patched[f"{type(module).__name__} (attention backend '{backend.value}')"] += 1
    for old, count in replaced.items():
        report.notes.append(f"{model_name}: attention backend '{old}', set before inject, replaced by "
                            f"'{backend.value}' on {count} modules; remove() restores it")
    for kind, count in not_dispatched.items():
        report.skipped.append(f"{model_name}: {count} attention modules with {kind}, which does not call diffusers' "
                              f"attention dispatcher: not '{backend.value}'")


def restore_backends(model: nn.Module) -> int:
    """Gives each processor :func:`use_backend` set the backend it had before, unless the user
    set another since (theirs stays); returns how many modules it covered."""
    modules = [m for _, m in _attention_modules(model) if _dispatched(m) and _STATE in m.processor.__dict__]
    for processor in {id(m.processor): m.processor for m in modules}.values():  # processors may be shared
        previous, ours = processor.__dict__.pop(_STATE)
        if processor._attention_backend == ours:
            processor._attention_backend = previous
    return len(modules)

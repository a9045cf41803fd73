"""Functional API: thin wrappers over ``torch.ops.ltx_kernels``.

Every op takes float32, float16 or bfloat16 tensors whose last dim is contiguous (rows may
be strided, e.g. a slice of a fused projection), computes in fp32 and rounds once on store.
Outputs are new contiguous tensors of the input's shape and dtype. While torch.compile traces a
call that will be differentiated, the norms, AdaLN forms, gated residuals, GELU and GLUs give
Inductor their formulas instead (:mod:`ltx_kernels._compile_formulas`: same math and rounding;
the outputs' strides are then Inductor's) so that it fuses them, and their gradients, with their
neighbours.
"""

from __future__ import annotations

import inspect
import math
import operator

import torch

from . import _compile_formulas
from ._ops import ops as _ops


# Scalar arguments are checked here, before the dispatcher (whose own message for a wrong
# type names neither the function nor the argument): a TypeError or ValueError that names both.


def _real(fn: str, name: str, value, *, minimum: float | None = None, positive: bool = False) -> float:
    try:
        # A tensor would convert too, but its value is data: read on the host it syncs a GPU
        # and breaks a torch.compile graph.
        if isinstance(value, (bool, str, bytes, torch.Tensor)):
            raise TypeError
        number = float(value)  # Python and numpy numbers (and SymFloats under torch.compile)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(value).__name__}") from None
    except OverflowError:  # an int beyond the float range
        raise ValueError(f"{fn}: {name} must be finite, got {value}") from None
    if not -math.inf < number < math.inf:  # NaN too; comparisons also trace under torch.compile
        raise ValueError(f"{fn}: {name} must be finite, got {value}")
    if minimum is not None and number < minimum:
        raise ValueError(f"{fn}: {name} must be >= {minimum}, got {value}")
    if positive and number <= 0:
        raise ValueError(f"{fn}: {name} must be > 0, got {value}")
    return number


def _integer(fn: str, name: str, value, *, minimum: int | None = None) -> int:
    try:
        if isinstance(value, (bool, torch.Tensor)):  # an integer tensor has __index__: see _real
            raise TypeError
        number = operator.index(value)  # ints, numpy integers, SymInts
    except TypeError:
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{fn}: {name} must be >= {minimum}, got {value}")
    if not -(2**63) <= number < 2**63:  # the dispatcher's int is int64
        raise ValueError(f"{fn}: {name} must fit in 64 bits, got {value}")
    return number


def _flag(fn: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{fn}: {name} must be a bool, got {type(value).__name__}")
    return value


def _eps(fn: str, eps) -> float:
    return _real(fn, "eps", eps, minimum=0.0)


def _choice(fn: str, name: str, value, choices: tuple[str, ...]) -> str:
    # isinstance first: `in` would compare a tensor or an array element-wise.
    if not (isinstance(value, str) and value in choices):
        raise ValueError(f"{fn}: {name} must be {' or '.join(map(repr, choices))}, got {value!r}")
    return value


def _strings(fn: str, name: str, value) -> tuple[str, ...]:
    # A list or tuple, not any iterable: one str would be taken character by character, and a
    # generator would be used up by this check.
    if not (isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value)):
        raise TypeError(f"{fn}: {name} must be a list or tuple of str, got {value!r}")
    return tuple(value)


def _run(name: str, *args):
    """Our op ``name`` on ``args``; or, while torch.compile traces a call that will be
    differentiated, its formula (:mod:`ltx_kernels._compile_formulas`), which Inductor fuses with
    the kernels around it. The op is called there too, so that its checks run on the traced
    call (its unused output leaves the graph)."""
    out = getattr(_ops, name)(*args)
    if _compile_formulas.traced_for_training(*args):
        return getattr(_compile_formulas, name)(*args)
    return out


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps) * (weight + weight_offset)``.

    ``weight`` is optional (diffusers' ``RMSNorm(elementwise_affine=False)`` has none);
    ``weight_offset=1.0`` gives Gemma's ``(1 + weight)``. ``weight`` may be float32 beside a
    16-bit ``x`` (as in ``torch.nn.functional.rms_norm``), as may the output: ``out_dtype``
    None is ``x``'s dtype, ``torch.float32`` keeps the fp32 result unrounded (the dtype of
    stock ``weight * normalized`` with an fp32 weight).
    """
    return _run("rms_norm", x, weight, _eps("rms_norm", eps), _real("rms_norm", "weight_offset", weight_offset),
                out_dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
                       *, weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rms_norm(h), h)`` with ``h = x + residual`` rounded to the input dtype.

    The norm is computed from the same rounded ``h`` that is returned, as a decoder layer
    that adds the residual and then normalizes would. ``weight`` in ``x``'s dtype or float32;
    both outputs in ``x``'s dtype.
    """
    fn = "fused_add_rms_norm"
    return _run(fn, x, residual, weight, _eps(fn, eps), _real(fn, "weight_offset", weight_offset))


def fused_add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
                        *, weight_offset: float = 0.0) -> torch.Tensor:
    """In-place :func:`fused_add_rms_norm`: ``residual`` becomes ``x + residual``; returns the norm."""
    fn = "fused_add_rms_norm_"
    return _ops.fused_add_rms_norm_(x, residual, weight, _eps(fn, eps), _real(fn, "weight_offset", weight_offset))


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last dim (biased variance).
    ``weight`` and ``bias`` in ``x``'s dtype or float32 (as ``torch.nn.functional.layer_norm``
    takes them); the output in ``x``'s dtype."""
    return _run("layer_norm", x, weight, bias, _eps("layer_norm", eps))


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    add: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.group_norm(x + add, num_groups, weight, bias, eps)``, then SiLU
    with ``activation="silu"``: a UNet's GroupNorm, its GroupNorm + SiLU, and a ResNet block's
    time-embedding add + norm2 + SiLU, each in one pass. ``x`` is ``[N, C, *]``, contiguous or
    channels last (the output keeps that layout; another is copied first); ``add`` ``[N, C]`` in
    ``x``'s dtype, added in fp32 (not rounded); ``weight`` and ``bias`` ``[C]`` in ``x``'s
    dtype or float32."""
    groups = _integer("group_norm", "num_groups", num_groups, minimum=1)
    silu = _choice("group_norm", "activation", "none" if activation is None else activation, ("none", "silu")) == "silu"
    return _ops.group_norm(x, groups, weight, bias, _eps("group_norm", eps), add, silu)


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
    return _run("adaln_rms_norm", x, scale, shift, weight, _eps("adaln_rms_norm", eps))


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
    return _run("adaln_layer_norm", x, scale, shift, weight, bias, _eps("adaln_layer_norm", eps))


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
    return _run("gated_residual_adaln_rms_norm", x, y, gate, scale, shift, weight,
                _eps("gated_residual_adaln_rms_norm", eps))


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
    """``x + y * gate`` in fp32, rounded once (``gate=None`` means 1).

    ``gate`` broadcasts over rows like :func:`adaln_rms_norm`'s ``scale``: ``[D]``, per batch
    ``[B, 1, D]`` or per token (``x``'s shape), strided views read in place. When the next
    op is an RMS norm with modulation, :func:`gated_residual_adaln_rms_norm` saves a pass.
    """
    return _run("gated_residual", x, y, gate)


def linear_gelu_tanh(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu(x @ weight.T + bias, approximate="tanh")``: in 16 bits on CUDA the GELU runs in the
    GEMM's epilogue (cuBLASLt), so the activation is written once; fp32 accumulation, the GELU
    applied before rounding, in the fp32 tanh form (as torch's CUDA GELU: 0 for pre-activations
    below about -5, whose GELU is < 1e-9 in magnitude). fp32 on CUDA, and the CPU: the GEMM, then
    ``gelu_tanh`` (its negative tail kept). ``x`` is ``[..., K]``, ``weight`` ``[N, K]``, ``bias``
    ``[N]``, one dtype."""
    return _ops.linear_gelu_tanh(x, weight, bias)


def glu_linear(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               activation: str = "silu") -> torch.Tensor:
    """``(act(a) * b) @ weight.T + bias``: a gated MLP's activation (``silu_and_mul``,
    ``gelu_tanh_and_mul`` or ``gelu_and_mul`` for ``activation`` ``"silu"``, ``"gelu_tanh"``,
    ``"gelu"``) and its down projection, computed as those two ops compute them. For training:
    the backward recomputes ``act(a) * b`` from ``a`` and ``b`` instead of keeping it, one
    ``[..., K]`` activation less to hold (a Llama MLP keeps two where it kept three). ``a``,
    ``b`` are ``[..., K]``, ``weight`` ``[N, K]``, ``bias`` ``[N]`` or None, one dtype."""
    _choice("glu_linear", "activation", activation, ("silu", "gelu_tanh", "gelu"))
    return _ops.glu_linear(a, b, weight, bias, activation)


def linear_gated_residual(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + gate * (x @ weight.T + bias)`` in fp32, rounded once: a DiT block's gated
    residual update written by the GEMM before it (an attention's output projection, a
    feed-forward's down projection). ``x`` ``[B, S, K]``, ``weight`` ``[N, K]``, ``bias`` ``[N]``
    or None, ``residual`` ``[B, S, N]``, ``gate`` ``[B, 1, N]``, ``[N]`` or None (ones), one
    dtype. On Hopper, in 16 bits, our CUTLASS GEMM's epilogue reads the residual and writes the
    sum (the linear's output never goes to memory, and is not rounded to 16 bits first as
    ``gated_residual(residual, linear(x), gate)`` rounds it); other GPUs and fp32: cuBLAS's GEMM
    into fp32, then the residual in torch ops; the CPU: the GEMM on fp32 upcasts, then the same.
    Differentiable."""
    return _ops.linear_gated_residual(x, weight, bias, residual, gate)


def fused_linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``cross_entropy(x @ weight.T + bias, target, ignore_index=ignore_index,
    reduction=reduction)`` without materializing the ``[tokens, vocab]`` logits: an LLM head's
    loss, computed over chunks of classes whose fp32 logits are about twice the size of ``x``.
    ``x`` is ``[..., hidden]``, ``weight`` ``[vocab, hidden]`` and ``bias`` ``[vocab]`` in one
    dtype, ``target`` int64 of ``x.shape[:-1]``; returns an fp32 loss (``reduction="none"``:
    one per token, 0 where ignored; ``"mean"`` averages over the targets not ignored, NaN when
    all are, as torch), and with ``return_lse`` also each token's fp32 log-sum-exp of the
    logits (differentiable, e.g. for a z-loss). Logits and softmax in fp32, never rounded to
    ``x``'s dtype. The backward recomputes each chunk's logits (four head GEMMs per training
    step, stock runs three) but not the log-sum-exp, which is saved; the weight gradient is
    written once per chunk of classes, x's is accumulated in fp32."""
    fn = "fused_linear_cross_entropy"
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{fn}: ignore_index must be an int, got {type(ignore_index).__name__}")
    reduction = _choice(fn, "reduction", reduction, ("mean", "sum", "none"))
    loss, lse = _ops.fused_linear_cross_entropy(x, weight, target, bias, ignore_index, reduction)
    return (loss, lse) if return_lse else loss


# FP8 linear path: e4m3 operands with one fp32 scale per row.


def quantize_fp8(x: torch.Tensor, activation: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``x`` ``[..., K]`` to ``float8_e4m3fn`` with one fp32 scale per row:
    returns ``(q, scale)``, ``q`` of ``x``'s shape and ``scale`` of ``x.shape[:-1]``, with
    ``x ~= q * scale[..., None]``. Exactly: ``amax = max(|row|, 1e-12)`` (NaN if the row has
    one), ``scale = amax / 448``, ``q = e4m3(x * (448 / amax))`` rounded to nearest even, each
    step in fp32. A row with inf or NaN gets non-finite elements and scale.

    ``activation="gelu_tanh"`` quantizes ``gelu(x, approximate="tanh")`` computed in fp32 (a
    GELU feed-forward's activation fused into the quantization of the down projection's
    input: one pass instead of two, and no bf16 rounding in between)."""
    return _ops.quantize_fp8(x, _choice("quantize_fp8", "activation", activation, ("none", "gelu_tanh")))


def rms_norm_fp8(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6, *, weight_offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rms_norm` for an FP8 GEMM's input: returns ``(q, q_scale)``, exactly
    ``quantize_fp8(rms_norm(x, weight, eps, weight_offset))`` in one pass, without writing the
    dtype output. Forward-only."""
    return _ops.rms_norm_fp8(x, weight, _eps("rms_norm_fp8", eps), _real("rms_norm_fp8", "weight_offset", weight_offset))


def fused_add_rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6, *,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`fused_add_rms_norm` for an FP8 GEMM's input: returns ``(q, q_scale,
    new_residual)``, ``new_residual = x + residual`` as there and ``(q, q_scale)`` exactly
    ``quantize_fp8`` of its norm, in one pass. Forward-only."""
    return _ops.fused_add_rms_norm_fp8(
        x, residual, weight, _eps("fused_add_rms_norm_fp8", eps),
        _real("fused_add_rms_norm_fp8", "weight_offset", weight_offset))


def adaln_rms_norm_fp8(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None = None,
                       eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`adaln_rms_norm` for an FP8 GEMM's input: returns ``(q, q_scale)``, exactly
    ``quantize_fp8(adaln_rms_norm(x, scale, shift, weight, eps))`` (the dtype output rounded,
    then quantized) in one pass, without writing the dtype output. Forward-only."""
    return _ops.adaln_rms_norm_fp8(x, scale, shift, weight, _eps("adaln_rms_norm_fp8", eps))


def adaln_layer_norm_fp8(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`adaln_layer_norm` for an FP8 GEMM's input (the AdaLN-Zero norms of FLUX, SD3,
    PixArt): returns ``(q, q_scale)``, exactly ``quantize_fp8(adaln_layer_norm(x, scale, shift,
    weight, bias, eps))`` in one pass, without writing the dtype output. Forward-only."""
    return _ops.adaln_layer_norm_fp8(x, scale, shift, weight, bias, _eps("adaln_layer_norm_fp8", eps))


def gated_residual_adaln_rms_norm_fp8(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None, scale: torch.Tensor,
                                      shift: torch.Tensor, weight: torch.Tensor | None = None,
                                      eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`gated_residual_adaln_rms_norm` for an FP8 GEMM's input: returns ``(x_new, q,
    q_scale)``, ``x_new`` as there and ``(q, q_scale)`` exactly ``quantize_fp8(normed)``, in one
    pass. Forward-only."""
    return _ops.gated_residual_adaln_rms_norm_fp8(
        x, y, gate, scale, shift, weight, _eps("gated_residual_adaln_rms_norm_fp8", eps))


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    activation: str = "none",
) -> torch.Tensor:
    """``x @ dequant(weight).T + bias`` in FP8: ``weight`` ``[N, K]`` is ``float8_e4m3fn`` with
    ``weight_scale`` ``[N]`` (one per output channel, as :func:`quantize_fp8` gives for the
    weight). A float ``x`` ``[..., K]`` is quantized per row here; an already quantized one is
    passed with its ``x_scale``. fp32 accumulation, scales and bias applied before the one
    rounding to ``out_dtype`` (default: ``x``'s dtype, or ``bias``'s / bfloat16 for an fp8
    ``x``); ``activation="gelu_tanh"`` applies GELU (tanh) to that fp32 result first, in the
    GEMM's epilogue (a feed-forward's up projection). K and N must be multiples of 16. A
    ``weight`` view whose rows are contiguous and 16-byte aligned (a block of a larger weight's
    columns, ``w[:, a:b]``) is read in place. On CUDA: our CUTLASS kernel on Hopper, else
    ``torch._scaled_mm`` (compute capability >= 8.9); fp16 / fp32 outputs or an activation of
    the latter take extra passes in torch ops."""
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):  # which dtypes: the op says
        raise TypeError(f"fp8_linear: out_dtype must be a torch.dtype or None, got {type(out_dtype).__name__}")
    if x_scale is None:
        if out_dtype is None:
            out_dtype = x.dtype
        x, x_scale = _ops.quantize_fp8(x)
    elif out_dtype is None:
        out_dtype = bias.dtype if bias is not None else torch.bfloat16
    activation = _choice("fp8_linear", "activation", activation, ("none", "gelu_tanh"))
    return _ops.fp8_linear(x, x_scale, weight, weight_scale, bias, out_dtype, activation)


def fp8_linear_gated_residual(
    x: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    gate: torch.Tensor | None,
) -> torch.Tensor:
    """``residual + gate * fp8_linear(x, weight, weight_scale, bias, x_scale=x_scale)`` in fp32,
    rounded once to ``residual``'s dtype: a DiT block's gated residual update written by the GEMM
    itself (on Hopper, the epilogue reads the residual and writes the new one: the linear's
    output never goes to memory). ``x`` ``[B, S, K]`` float8_e4m3fn with ``x_scale`` ``[B, S]``
    (:func:`quantize_fp8`, or a norm's FP8 output), ``residual`` ``[B, S, N]``, ``gate``
    ``[B, 1, N]`` or ``[N]`` and ``bias`` in ``residual``'s dtype; ``gate=None``: no gate,
    ``residual + fp8_linear(...)`` (an ungated residual, e.g. a text cross-attention's).
    Forward-only."""
    return _ops.fp8_linear_gated_residual(x, x_scale, weight, weight_scale, bias, residual, gate)


# Attention.


# Where ltx_kernels.attention's CUDA kernels switch (src/ops/attention_workspace.h), for the
# integrations that route calls to it: exact attention against at most ATTENTION_SHORT_KEYS
# keys runs the short-key kernel (kShortMaxKeys); at most ATTENTION_DECODE_ROWS query rows per
# kv head (tokens x grouped query heads) against ATTENTION_DECODE_MIN_KEYS keys or more, the
# decode kernel (kDecodeMaxRows, kDecodeMinKeys). test_attention.py checks that they are the header's.
ATTENTION_SHORT_KEYS = 128
ATTENTION_DECODE_ROWS = 16
ATTENTION_DECODE_MIN_KEYS = 512
# Whether this build has the Hopper (sm_90a) kernels: attention's wgmma kernel on sm_90 GPUs
# (without them, the portable sm_80 kernel, slower there than SDPA's cuDNN backend) and the
# CUTLASS FP8 GEMM. A constant, so that torch.compile reads it without a graph break.
SM90A_KERNELS = bool(_ops.has_sm90a_kernels())


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    attn_mask: torch.Tensor | None = None,
    precision: str = "bf16",
) -> torch.Tensor:
    """Non-causal ``softmax(q k^T * scale + mask) v`` in SDPA's layout: ``q`` ``[B, Hq, Sq, D]``,
    ``k`` and ``v`` ``[B, Hkv, Sk, D]`` (``Hq`` a multiple of ``Hkv``), strided views fine (last
    dim contiguous). ``scale`` defaults to ``1 / sqrt(D)``; ``attn_mask`` as SDPA's: bool
    (True = attend) or floating (added), broadcast to ``[B, Hq, Sq, Sk]``. A query whose keys
    are all masked gets zeros. ``precision="8bit"``: SageAttention's method, q and k in INT8
    with one scale per 64-token block and head, k first smoothed by its mean over the keys
    (softmax is invariant to it); the definition is in ``include/ltx_kernels/attention.h``.
    The output is ``[B, Hq, Sq, D]`` laid out as ``[B, Sq, Hq, D]`` (as SDPA's flash backend),
    so ``out.transpose(1, 2).flatten(2)`` is a view.

    The CPU implementation is that definition (the reference). CUDA: bf16 or fp16 inputs, head
    dim 64 or 128 (others raise); a Hopper wgmma kernel on sm_90, a portable one from sm_80. On
    an H100 the exact Hopper kernel is faster than SDPA's cuDNN backend at head dim 64 and long
    sequences, slower at head dim 128 (benchmarks/results/h100/attention.md).

    Differentiable: the backward is the exact attention's gradient at ``q``, ``k``, ``v`` (and
    a floating ``attn_mask``), for ``"8bit"`` too (straight through its rounding, as in
    quantization-aware training), computed by a composite of torch ops in fp32 in chunks of
    bounded memory: correct, not yet a fused kernel."""
    precision = _choice("attention", "precision", precision, ("bf16", "8bit"))
    if scale is not None:
        scale = _real("attention", "scale", scale)
    return _ops.attention(q, k, v, attn_mask, scale, precision)


# Activations. Math is fp32 (accurate tanh / erf / exp), rounded once.


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """``gelu(x, approximate="tanh")``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    return _run("gelu_tanh", x)


def gelu_tanh_and_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(a) * b`` (GEGLU with the tanh GELU, two inputs of the same shape)."""
    return _run("gelu_tanh_and_mul", a, b)


def gelu_and_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gelu(a) * b`` with the exact (erf) GELU. diffusers' ``GEGLU`` computes
    ``hidden * gelu(gate)`` for ``hidden, gate = proj(x).chunk(2, -1)``: that is
    ``gelu_and_mul(gate, hidden)`` (the halves can be passed as the views ``chunk`` returns)."""
    return _run("gelu_and_mul", a, b)


def silu_and_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` (SwiGLU as Llama's MLP computes ``act(gate_proj(x)) * up_proj(x)``)."""
    return _run("silu_and_mul", a, b)


def _gelu_approximate(approximate: bool | str) -> str:
    if isinstance(approximate, bool):
        return "tanh" if approximate else "none"
    if not (isinstance(approximate, str) and approximate in ("tanh", "none")):  # as in _choice
        raise ValueError(f"geglu: approximate must be True, False, 'tanh' or 'none', got {approximate!r}")
    return approximate


def geglu(
    input: torch.Tensor, out: torch.Tensor | None = None, approximate: bool | str = True
) -> torch.Tensor:
    """GEGLU on a concatenated ``[..., 2H]`` input: ``gelu(input[..., :H]) * input[..., H:]``.

    ``approximate``: ``True`` / ``"tanh"`` (default) or ``False`` / ``"none"`` (exact erf
    GELU). ``out``: an optional contiguous ``[..., H]`` tensor written in place. (The
    signature of the original package; note that diffusers' ``GEGLU`` gates the other half,
    see :func:`gelu_and_mul`.)
    """
    approximate = _gelu_approximate(approximate)
    if out is None:
        return _run("geglu", input, approximate)
    _ops.geglu.out(input, approximate, out=out)
    return out


def swiglu(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU on a concatenated ``[..., 2H]`` input: ``silu(input[..., :H]) * input[..., H:]``."""
    if out is None:
        return _run("swiglu", input)
    _ops.swiglu.out(input, out=out)
    return out


# Rotary position embeddings.


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    unsqueeze_dim: int = 1,
    sections: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q * cos + rotate(q) * sin, k * cos + rotate(k) * sin)`` with the model's cos/sin.

    ``q``, ``k``: ``[B, H, S, Dh]`` (``unsqueeze_dim=1``, as transformers passes them) or
    ``[B, S, H, Dh]`` (``unsqueeze_dim=2``), any strides with a contiguous last dim (views
    of a fused QKV projection are read in place); ``k`` may have fewer heads (GQA).
    ``cos``, ``sin``: ``[B, S, R]`` or ``[S, R]`` in the dtype of q or float32, as the model's
    rotary module returns them (so rope scaling is whatever the model computed). Channels
    ``>= R`` pass through (partial rotary). ``rotate`` is transformers' ``rotate_half``
    (pairs ``(i, i + R/2)``) or, with ``interleaved=True``, pairs ``(2i, 2i + 1)``;
    ``sections`` splits the ``R`` channels into up to three half-split sections.
    fp32 math, one rounding; returns new tensors shaped like q and k.
    """
    fn = "apply_rotary_pos_emb"
    interleaved = _flag(fn, "interleaved", interleaved)
    unsqueeze_dim = _integer(fn, "unsqueeze_dim", unsqueeze_dim)
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"{fn}: unsqueeze_dim must be 1 (q, k are [B, H, S, Dh]) or 2 ([B, S, H, Dh]), "
                         f"got {unsqueeze_dim}")
    if sections is not None:
        if not isinstance(sections, (list, tuple)):
            raise TypeError(f"{fn}: sections must be a list of ints or None, got {type(sections).__name__}")
        sections = [_integer(fn, "sections", n, minimum=0) for n in sections]
        if not 1 <= len(sections) <= 3 or any(n % 2 for n in sections) or interleaved:
            raise ValueError(f"{fn}: sections must be 1 to 3 even ints, with interleaved=False, got {sections}")
    return _ops.apply_rotary_pos_emb(q, k, cos, sin, interleaved, unsqueeze_dim, sections)


def _rope_angles(positions: torch.Tensor, dims: int, theta: float) -> torch.Tensor:
    """``positions[:, None] * theta ** (-2i / dims)`` for i < dims / 2, in float64."""
    exponents = torch.arange(0, dims, 2, dtype=torch.float64, device=positions.device) / dims
    return positions.to(torch.float64)[:, None] * theta ** (-exponents)[None, :]


def _check_tokens(fn: str, name: str, x: torch.Tensor, grid: list[int], dims: int) -> None:
    """``x`` of ``dims`` dims (tokens in dim 1) against the grid, before the dispatcher, whose
    message calls every tensor ``x``; other layouts are the dispatcher's to report."""
    tokens = grid[0] * grid[1] * grid[2]
    if x.dim() == dims and x.shape[1] != tokens:
        raise ValueError(f"{fn}: {name} must have num_frames * height * width = {tokens} tokens in dim 1, "
                         f"got shape {tuple(x.shape)}")


def rope_1d(
    query: torch.Tensor, key: torch.Tensor, theta_base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard RoPE on ``[B, S, H, Dh]`` query and key (the original package's op).

    Positions ``0..S-1``, frequencies ``theta_base ** (-2i / Dh)``, interleaved pairs
    ``(2i, 2i + 1)`` rotated by ``position * freq_i``. Returns new tensors (the original
    returned its inputs modified in place). The angle tables (``[S, Dh]``) are formed in
    float64 and rounded to float32.
    """
    theta_base = _real("rope_1d", "theta_base", theta_base, positive=True)
    seq, head_dim = query.shape[1], query.shape[-1]
    positions = torch.arange(seq, device=query.device)
    angles = _rope_angles(positions, head_dim, theta_base).repeat_interleave(2, dim=-1)
    cos, sin = angles.cos().float(), angles.sin().float()
    return apply_rotary_pos_emb(query, key, cos, sin, interleaved=True, unsqueeze_dim=2)


def rope_3d_sections(head_dim: int) -> tuple[int, int, int]:
    """How :func:`rope_3d` splits ``head_dim``: ``t = h = 2 * (head_dim // 6)`` channels for
    frames and height, ``w = 2 * ((head_dim - t - h) // 2)`` for width; an odd last channel
    passes through."""
    head_dim = _integer("rope_3d_sections", "head_dim", head_dim, minimum=0)
    t = (head_dim // 3) // 2 * 2
    return t, t, (head_dim - 2 * t) // 2 * 2


def rope_3d(
    query: torch.Tensor,
    key: torch.Tensor,
    num_frames: int,
    height: int,
    width: int,
    theta_base: float = 10000.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """3D video RoPE per head on ``[B, F*H*W, heads, Dh]`` query and key.

    Token ``s`` is the grid point ``(f, h, w) = (s // (H*W), (s // W) % H, s % W)``.
    ``head_dim`` is split into three consecutive sections of sizes :func:`rope_3d_sections`
    for ``f``, ``h`` and ``w``. In a section of ``n`` channels starting at ``c0``, channel
    ``c0 + i`` pairs with ``c0 + n/2 + i`` (``rotate_half`` within the section) and both are
    rotated by ``position * theta_base ** (-2i / n)``. Channels after the three sections (one
    when ``Dh`` is odd) pass through. Returns new tensors.
    """
    num_frames, height, width = (_integer("rope_3d", name, value, minimum=1)
                                 for name, value in (("num_frames", num_frames), ("height", height), ("width", width)))
    theta_base = _real("rope_3d", "theta_base", theta_base, positive=True)
    head_dim = query.shape[-1]
    _check_tokens("rope_3d", "query", query, [num_frames, height, width], 4)
    device = query.device
    grid = torch.meshgrid(
        torch.arange(num_frames, device=device),
        torch.arange(height, device=device),
        torch.arange(width, device=device),
        indexing="ij",
    )
    sections = [n for n in rope_3d_sections(head_dim)]
    angles = torch.cat(
        [_rope_angles(g.reshape(-1), n, theta_base).repeat(1, 2) for g, n in zip(grid, sections)],
        dim=-1,
    )
    cos, sin = angles.cos().float(), angles.sin().float()
    return apply_rotary_pos_emb(
        query, key, cos, sin, interleaved=False, unsqueeze_dim=2, sections=sections
    )


def ltx_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' LTX-Video ``apply_rotary_emb(x, (cos, sin))``: ``x`` is ``[B, S, D]`` (all
    heads), ``cos``/``sin`` the ``[B, S, D]`` tables of ``LTXVideoRotaryPosEmbed`` (float32, or
    x's dtype); interleaved pairs, per-channel cos/sin, fp32 math."""
    return _ops.ltx_rope(x, cos, sin)


def _ltx_positions(
    fn: str,
    num_frames: int,
    height: int,
    width: int,
    rope_interpolation_scale,
    video_coords: torch.Tensor | None,
    theta: float,
    base_num_frames: int,
    base_height: int,
    base_width: int,
    patch_size: int,
    patch_size_t: int,
) -> tuple[list[int], list[float], torch.Tensor | None, float]:
    """The LTX RoPE's positions, checked for ``fn``: ``(grid, axis_scale, video_coords, theta)``
    of LTXVideoRotaryPosEmbed, positions scaled per axis by ``axis_scale`` before ``2 * g - 1``.
    With ``video_coords`` the grid is unused (the pipelines pass no sizes then) and is given as
    zeros."""
    theta = _real(fn, "theta", theta, positive=True)
    base = [_real(fn, name, value, positive=True) for name, value in
            (("base_num_frames", base_num_frames), ("base_height", base_height), ("base_width", base_width))]
    if video_coords is not None:
        return [0, 0, 0], [1.0 / b for b in base], video_coords, theta
    grid = [_integer(fn, name, value, minimum=1) for name, value in
            (("num_frames", num_frames), ("height", height), ("width", width))]
    if rope_interpolation_scale is None:
        return grid, [1.0, 1.0, 1.0], None, theta
    scale = rope_interpolation_scale
    if not isinstance(scale, (list, tuple)) or len(scale) != 3:
        raise TypeError(f"{fn}: rope_interpolation_scale must be 3 numbers (frames, height, width) in a list or "
                        f"tuple, or None, got {scale!r}")
    scale = [_real(fn, "rope_interpolation_scale", r) for r in scale]
    patches = [_real(fn, name, value, positive=True) for name, value in
               (("patch_size_t", patch_size_t), ("patch_size", patch_size), ("patch_size", patch_size))]
    return grid, [r * p / b for r, p, b in zip(scale, patches, base)], None, theta


def ltx_rope_angles(
    x: torch.Tensor,
    num_frames: int,
    height: int,
    width: int,
    rope_interpolation_scale=None,
    video_coords: torch.Tensor | None = None,
    theta: float = 10000.0,
    *,
    base_num_frames: int = 20,
    base_height: int = 2048,
    base_width: int = 2048,
    patch_size: int = 1,
    patch_size_t: int = 1,
) -> torch.Tensor:
    """LTX-Video RoPE with the angles computed in the kernel: the same result as
    ``apply_rotary_emb(x, LTXVideoRotaryPosEmbed(D, ...)(x, num_frames, height, width,
    rope_interpolation_scale, video_coords))`` without materializing the tables.

    Positions: the ``(num_frames, height, width)`` grid (``S`` must be their product),
    scaled by ``rope_interpolation_scale[a] * patch / base`` per axis when given, or
    ``video_coords`` (``[B, 3, S]``) divided by the bases. Angles are formed in fp64, so they
    are more accurate than diffusers' fp32 tables (see ``include/ltx_kernels/rope.h``).
    """
    fn = "ltx_rope_angles"
    grid, scale, coords, theta = _ltx_positions(fn, num_frames, height, width, rope_interpolation_scale, video_coords,
                                                theta, base_num_frames, base_height, base_width, patch_size,
                                                patch_size_t)
    if coords is None:
        _check_tokens(fn, "x", x, grid, 3)
    return _ops.ltx_rope_angles(x, grid, scale, coords, theta)


# The position arguments after (num_frames, height, width) with their defaults, ltx_rope_angles'
# own: ltx_qk_norm_rope takes them as keywords.
_LTX_POSITION_DEFAULTS = {name: param.default for name, param in
                          list(inspect.signature(ltx_rope_angles).parameters.items())[4:]}


def ltx_qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    weight_q: torch.Tensor | None,
    weight_k: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    num_frames: int,
    height: int,
    width: int,
    **positions,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LTX-Video attention's query/key path in one launch: ``norm_q`` / ``norm_k`` (RMS norm
    across the whole ``[B, S, D]`` row with weight) followed by the LTX RoPE of
    :func:`ltx_rope_angles`, for q and k together (each angle computed once for both).
    ``q`` and ``k`` may be row-strided views (e.g. of a fused projection). fp32 math from
    load to store: the normalized values are not rounded before the rotation.

    ``positions``: :func:`ltx_rope_angles`' keywords after the grid, with its defaults
    (``rope_interpolation_scale``, ``video_coords``, ``theta``, ``base_num_frames``,
    ``base_height``, ``base_width``, ``patch_size``, ``patch_size_t``)."""
    fn = "ltx_qk_norm_rope"
    unknown = sorted(set(positions) - set(_LTX_POSITION_DEFAULTS))
    if unknown:
        raise TypeError(f"{fn}: unexpected keyword argument(s) {', '.join(unknown)}; the positions take "
                        f"{', '.join(_LTX_POSITION_DEFAULTS)}")
    grid, scale, coords, theta = _ltx_positions(fn, num_frames, height, width,
                                                **{**_LTX_POSITION_DEFAULTS, **positions})
    if coords is None:
        _check_tokens(fn, "q", q, grid, 3)
    return _ops.ltx_qk_norm_rope(q, k, weight_q, weight_k, _eps(fn, eps), grid, scale, coords, theta)


# Names of the original ltx_kernels package, kept so code written against it keeps working.
# Each takes the defaults of the function it stands for (one default per op, the op schema's).


def rmsnorm(input: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Old name of :func:`rms_norm`, with its defaults."""
    return rms_norm(input, weight, _eps("rmsnorm", eps))


def rmsnorm_residual(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Old name of :func:`fused_add_rms_norm`, with its defaults: returns ``(out, new_residual)``."""
    return fused_add_rms_norm(input, residual, weight, _eps("rmsnorm_residual", eps))


def _per_batch(t: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """The original package accepted [B, D] modulation for a [B, S, D] input."""
    return t.unsqueeze(1) if t.dim() == 2 and input.dim() == 3 else t


def adaln_rmsnorm(input: torch.Tensor, weight: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor,
                  eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
    """Old name: ``rms_norm(input) * weight * (1 + scale) + shift`` (:func:`adaln_rms_norm`);
    ``scale``/``shift`` may also be ``[B, D]`` for a ``[B, S, D]`` input."""
    scale, shift, eps = _per_batch(scale, input), _per_batch(shift, input), _eps("adaln_rmsnorm", eps)
    if out is None:
        return adaln_rms_norm(input, scale, shift, weight, eps)
    _ops.adaln_rms_norm.out(input, scale, shift, weight, eps, out=out)  # written in place, no copy
    return out


def adaln_layernorm(input: torch.Tensor, weight: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor,
                    bias: torch.Tensor | None = None, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
    """Old name: ``(layer_norm(input) * weight + bias) * (1 + scale) + shift``
    (:func:`adaln_layer_norm`); ``[B, D]`` modulation accepted as in :func:`adaln_rmsnorm`.

    ``eps`` defaults to 1e-6, :func:`adaln_layer_norm`'s and its op schema's (the eps of
    diffusers' AdaLN norms), so both names compute the same by default; the original package
    defaulted to 1e-5 here (pass ``eps=1e-5`` for that; the two differ by ~1e-5 relative for
    unit-variance rows)."""
    scale, shift, eps = _per_batch(scale, input), _per_batch(shift, input), _eps("adaln_layernorm", eps)
    if out is None:
        return adaln_layer_norm(input, scale, shift, weight, bias, eps)
    _ops.adaln_layer_norm.out(input, scale, shift, weight, bias, eps, out=out)  # written in place, no copy
    return out


def adaln_zero(input: torch.Tensor, weight: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor,
               gate: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
    """Old name: ``(rms_norm(input) * weight * (1 + scale) + shift) * gate``.

    Two passes (:func:`adaln_rms_norm`, then the gate multiply; with ``out``, both in it). In a DiT the gate belongs on
    the branch output: :func:`gated_residual` / :func:`gated_residual_adaln_rms_norm` fuse it
    where it is used.
    """
    normed = adaln_rmsnorm(input, weight, scale, shift, _eps("adaln_zero", eps), out=out)
    gate = _per_batch(gate, input)
    return normed * gate if out is None else out.mul_(gate)

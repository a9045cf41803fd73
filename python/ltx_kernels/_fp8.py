"""The FP8 linear path of the integrations (``inject(..., precision="fp8")``).

Each chosen ``nn.Linear`` gets its weight quantized once to ``float8_e4m3fn`` with one fp32
scale per output channel (:func:`ltx_kernels.quantize_fp8`); the bf16 weight is freed. Its
forward then runs :func:`ltx_kernels.fp8_linear`: the input is quantized per token, the GEMM
accumulates in fp32 and applies both scales and the bias before one rounding. Quantizing is
one-way: the bf16 weights are gone, so the model cannot be restored (reload it instead).
"""

from __future__ import annotations

import fnmatch
from typing import NamedTuple

import torch
from torch import nn

from . import ops
from ._patching import attend, call_fused, device_capability, is_patched, patch, runs_unhooked

# Linears that stay bf16 by default: the model's input and output projections and the
# embeddings (timestep, caption) and AdaLN tables, outside the transformer blocks, where the
# error of 8 bits is not spread over a block's residual stream and the time is negligible.
# (Wan's condition_embedder also casts the timestep to its time embedder's weight dtype;
# DiT's output is proj_out_1, its final AdaLN table, then proj_out_2.)
#
# Also the cross-attention's key and value projections (``attn2``: of the text, and of Wan's
# image context): their few rows (128 text tokens against 5376 to 16128 video tokens in an LTX
# step) cost nothing in bf16, and their rounding error is shared by every query, where the
# error of a projection of the video tokens differs from token to token and averages out. The
# fidelity benchmark (LTX-2B, 49 frames, vs fp32, H100) measured FP8 with them 1.54e-2 (10-step
# denoise) / 1.92e-2 (one step), without them 1.33e-2 / 1.80e-2. Of the other block linears,
# the cross-attention's output projection matters next (1.17e-2 / 1.54e-2 in bf16), but it is a
# full-size GEMM (~2 ms a step at 161 frames): it stays FP8; each attn1 or feed-forward kind
# moved the error by 1% or less (benchmarks/results/h100/fidelity_fp8_skip.md).
#
# A UNet's timestep and added-condition embeddings and each ResNet block's time-embedding
# projection take one row per sample (2 with CFG): in FP8 they would only add rounding and a
# quantize launch. The image VAE's only linears (its encoder's and decoder's mid-block
# attention) are a sliver of a decode, which its convolutions take, and nothing after them
# averages their error out of the pixels.
DEFAULT_FP8_SKIP = ("proj_in", "proj_out*", "time_embed.*", "caption_projection.*", "condition_embedder.*", "*adaln*",
                    "norm_out.*", "*.attn2.to_k", "*.attn2.to_v", "*.attn2.add_k_proj", "*.attn2.add_v_proj",
                    "time_embedding.*", "add_embedding.*", "*.time_emb_proj", "encoder.mid_block.*",
                    "decoder.mid_block.*")
MARKER = "_ltx_kernels_fp8"
KIND = "nn.Linear (fp8_linear, e4m3 weights and per-token activations)"
FF_KIND = "FeedForward GELU-tanh (fp8 up with the GELU in its GEMM's epilogue, fp8 down)"


# transformers LLMs: the head (vocabulary-wide logits) stays in the model's dtype.
DEFAULT_LLM_FP8_SKIP = ("lm_head",)
PRECISIONS = ("bf16", "fp8")


def is_quantized(module: nn.Module) -> bool:
    return MARKER in module.__dict__


def check_precision(model: nn.Module, precision: str) -> None:
    """Refuses, before anything changes, to mix precisions on one model or to run FP8 on a
    GPU without it."""
    name = type(model).__name__
    if any(is_quantized(m) for m in model.modules()):
        if precision != "fp8":
            raise ValueError(f"{name} was patched with precision='fp8', which is one-way (its weights are "
                             f"quantized): reload the model to patch it with precision={precision!r}")
    elif precision == "fp8" and any(is_patched(m) for m in model.modules()):
        raise ValueError(f"{name} is already patched with precision='bf16': call remove() first, then "
                         "patch it with precision='fp8'")
    check_device_supports_dtype(model)
    if precision == "fp8":
        check_device_supports_fp8(model)
        check_not_offloaded(model)


def check_removable(model: nn.Module) -> None:
    """Raises, before anything changes, for a model whose weights FP8 quantized."""
    if any(is_quantized(m) for m in model.modules()):
        raise RuntimeError(f"{type(model).__name__} was patched with precision='fp8', which is one-way: its "
                           "original weights were freed. Reload the model to get the stock one back.")


def check_not_offloaded(model: nn.Module) -> None:
    """Refuses FP8 on a model whose weights sit on the meta device: accelerate's offload
    (``device_map`` with "cpu" / "disk" entries, ``cpu_offload``, diffusers'
    ``enable_sequential_cpu_offload``) keeps the real weights in its own map and loads them
    into the module for each forward, so weights quantized in the module would be replaced by
    the originals, and their scales would stay on the meta device."""
    offloaded = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if offloaded:
        raise ValueError(
            f"precision='fp8' cannot quantize {type(model).__name__}: {len(offloaded)} parameters (e.g. "
            f"{offloaded[0]}) are on the meta device: built without weights (torch.device('meta'), "
            "init_empty_weights), or offloaded by accelerate (device_map offload, cpu_offload, "
            "enable_sequential_cpu_offload), which reloads the original weights for each forward. Load the weights "
            "first; patch with precision='fp8' before offloading (the quantized weights are then what is offloaded)."
        )


def check_adapters(modules) -> None:
    """Raises when a peft adapter layer (LoRA) wraps one of our FP8 linears: peft casts its
    LoRA matrices to the base weight's dtype, e4m3, and cannot compute with them."""
    for m in modules:
        base = m._modules.get("base_layer")
        if base is not None and MARKER in base.__dict__:
            raise RuntimeError(
                f"a peft adapter layer ({type(m).__module__}.{type(m).__name__}) was added to a linear that "
                "ltx_kernels quantized with precision='fp8': peft LoRA adapters cannot run on e4m3 weights (peft "
                "casts the LoRA matrices to e4m3). Add or load the adapters before patching with precision='fp8' "
                "(the linears inside an adapter then stay in the model's dtype), or patch with precision='bf16'."
            )


def _cuda_devices(model: nn.Module, dtype: torch.dtype | None = None) -> set[torch.device]:
    """The GPUs holding the model's parameters (of ``dtype``, when given)."""
    return {p.device for p in model.parameters() if p.device.type == "cuda" and dtype in (None, p.dtype)}


def _gpus_below(model: nn.Module, capability: tuple[int, int], dtype: torch.dtype | None = None):
    """(name, device, "major.minor") of each GPU holding the model's parameters (of ``dtype``,
    when given) whose compute capability is below ``capability``."""
    for device in sorted(_cuda_devices(model, dtype), key=str):
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < capability:
            yield torch.cuda.get_device_name(device), device, f"{major}.{minor}"


def check_device_supports_dtype(model: nn.Module) -> None:
    """Raises before anything is changed when bfloat16 parameters live on a GPU without
    bfloat16 arithmetic (before compute capability 8.0, e.g. a T4), where every op raises."""
    for name, device, capability in _gpus_below(model, (8, 0), torch.bfloat16):
        raise ValueError(
            f"{type(model).__name__} has bfloat16 parameters on {name} ({device}, compute capability {capability}), "
            "which has no bfloat16 arithmetic: ltx_kernels runs bfloat16 from compute capability 8.0 (Ampere) on. "
            "Convert the model to float16 (.half()) or float32 first."
        )


def check_device_supports_fp8(model: nn.Module) -> None:
    """Raises before anything is changed when a parameter lives on a GPU without FP8."""
    for name, device, capability in _gpus_below(model, (8, 9)):
        raise RuntimeError(
            f"precision='fp8' needs FP8 tensor cores (compute capability >= 8.9: Ada, Hopper); {name} on {device} "
            f"has compute capability {capability}. Use precision='bf16'."
        )


def bias_of(linear: nn.Linear, dtype: torch.dtype) -> torch.Tensor | None:
    """The linear's bias in ``dtype`` (the GEMM adds it in the output's dtype)."""
    bias = linear.bias
    return bias.to(dtype) if bias is not None and bias.dtype != dtype else bias


def rows(x: torch.Tensor) -> torch.Tensor:
    """x with a contiguous last dim, as quantize_fp8 reads it: nn.Linear takes any layout (e.g.
    SDXL's proj_in gets a permuted [B, H*W, C] view of the group norm's NCHW output), so one
    copy where the last dim is strided."""
    return x if x.size(-1) <= 1 or x.stride(-1) == 1 else x.contiguous()


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return ops.fp8_linear(rows(x), self.weight, self.weight_scale, bias_of(self, x.dtype))


def _adjacent(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The tensors as one, concatenated along dim 0, where each one's elements follow the
    previous one's in one storage (how :func:`quantize_linears` stores a projection group's
    weights, scales and biases); else None."""
    first = tensors[0]
    if first is None or not first.is_contiguous():
        return None
    storage, end, rows = first.untyped_storage().data_ptr(), first.data_ptr(), 0
    for t in tensors:
        if (t is None or t.dtype != first.dtype or t.shape[1:] != first.shape[1:] or not t.is_contiguous()
                or t.data_ptr() != end or t.untyped_storage().data_ptr() != storage):
            return None
        rows += t.size(0)
        end += t.numel() * t.element_size()
    return first.as_strided((rows, *first.shape[1:]), first.stride())


def _quantized_matmuls(q: torch.Tensor, scale: torch.Tensor, linears, dtype: torch.dtype) -> list[torch.Tensor]:
    """``[m(x) for m in linears]`` for an ``x`` quantized as ``(q, scale)``: one GEMM for all when
    their weights are stored adjacent (a projection group of :func:`quantize_linears`), the
    outputs then views of its output (strided rows); else one GEMM each (:func:`_merged`)."""
    biases = [bias_of(m, dtype) for m in linears]
    merged = _merged(linears, biases, "weight", "weight_scale")
    if merged is not None:
        out = ops.fp8_linear(q, *merged, x_scale=scale, out_dtype=dtype)
        return list(out.split([m.out_features for m in linears], dim=-1))
    return [ops.fp8_linear(q, m.weight, m.weight_scale, b, x_scale=scale, out_dtype=dtype)
            for m, b in zip(linears, biases)]


def _merged(linears, biases: list, *kinds: str) -> tuple | None:
    """The group's tensors of each kind (``weight``, ``weight_scale``), then its bias, each as
    one tensor where :func:`quantize_linears` stored them adjacent (:func:`_adjacent`); None for
    a single linear, a group stored apart, or under torch.compile (the storage addresses that
    prove adjacency are not traceable)."""
    if len(linears) < 2 or torch.compiler.is_compiling():
        return None
    tensors = []
    for kind in kinds:
        tensors.append(_adjacent([getattr(m, kind) for m in linears]))
        if tensors[-1] is None:
            return None
    if all(b is None for b in biases):
        return (*tensors, None)
    bias = _adjacent(biases)
    return None if bias is None else (*tensors, bias)


def matmul_gated_residual(x: torch.Tensor | Quantized, linear: nn.Linear, residual: torch.Tensor,
                          gate: torch.Tensor | None) -> torch.Tensor:
    """``residual + gate * linear(x)`` as one GEMM writing the sum, for a ``linear`` that
    :func:`gemm_writes_residual` (a gate that :func:`fuses_gated_residual`; None: ``residual +
    linear(x)``): :func:`ops.fp8_linear_gated_residual` for our FP8 linear (``x`` quantized
    here, or coming quantized), else :func:`ops.linear_gated_residual`."""
    if not is_quantized(linear):
        return ops.linear_gated_residual(x, linear.weight, linear.bias, residual, gate)
    q, scale = (x.q, x.scale) if isinstance(x, Quantized) else ops.quantize_fp8(x)
    return ops.fp8_linear_gated_residual(q, scale, linear.weight, linear.weight_scale, bias_of(linear, residual.dtype),
                                         residual, gate)


def gemm_writes_residual(linear: nn.Module, residual: torch.Tensor) -> bool:
    """Whether ``linear``'s GEMM can write ``residual + gate * linear(x)`` (:func:`matmul_gated_residual`):
    it is our FP8 linear, unhooked (:func:`take_quantized`), or a plain ``nn.Linear``, unhooked,
    whose weight is a plain tensor in the residual's dtype, where :func:`ops.linear_gated_residual`
    runs our kernel: on CUDA a Hopper GPU with this build's sm_90a kernels, 16-bit, N and K
    multiples of 8 (elsewhere its fallback, the GEMM into fp32 then torch ops, is slower than the
    linear then ``gated_residual``). On the CPU always, so that CPU tests take the path a GPU takes.
    (peft's LoRA layers are not ``nn.Linear``s; layerwise casting and offload are hooks.) Not
    under autocast, where the linear's output is in the autocast dtype and the sum in the
    residual's (mixed-precision training's fp32 stream)."""
    if take_quantized((linear,)):
        return True
    if type(linear) is not nn.Linear or not runs_unhooked(linear) or torch.is_autocast_enabled(residual.device.type):
        return False
    weight, bias = linear.weight, linear.bias
    if weight.dtype != residual.dtype or weight.device != residual.device or (bias is not None and bias.dtype != weight.dtype):
        return False
    if residual.device.type == "cpu":
        return True
    return (residual.device.type == "cuda" and ops.SM90A_KERNELS and residual.dtype in (torch.bfloat16, torch.float16)
            and weight.size(0) % 8 == 0 and weight.size(1) % 8 == 0
            and device_capability(residual.device.index)[0] == 9)


def fuses_gated_residual(residual: torch.Tensor, gate: torch.Tensor | None) -> bool:
    """Whether ``residual + gate * linear(...)`` can be one :func:`ops.fp8_linear_gated_residual`:
    a ``[B, S, N]`` residual and no gate or one row per sample (``[B, 1, N]``; per-token gates,
    e.g. image-to-video's, take the linear and ``gated_residual``) in the residual's dtype."""
    return residual.dim() == 3 and (gate is None or (gate.dim() == 3 and gate.size(1) == 1
                                                      and gate.size(0) == residual.size(0)
                                                      and gate.dtype == residual.dtype))


class Quantized(NamedTuple):
    """An activation its producer wrote in FP8 (a norm with an FP8 output): what
    :func:`linears` and the fused feed-forward take in place of the dtype tensor, for modules
    that :func:`take_quantized`."""

    q: torch.Tensor  # float8_e4m3fn, the activation's shape
    scale: torch.Tensor  # fp32, one per row
    dtype: torch.dtype  # of the activation, and of the linears' outputs

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


def take_quantized(modules) -> bool:
    """Whether every module is an FP8 linear of ours that runs unhooked: then its input may
    come quantized by its producer (a hook or an adapter must see the dtype input)."""
    return all(is_quantized(m) and runs_unhooked(m) for m in modules)


def linears(x: torch.Tensor | Quantized, modules: tuple[nn.Module, ...]) -> list[torch.Tensor]:
    """``[m(x) for m in modules]``; when every module is an FP8 linear of ours without hooks,
    ``x`` is quantized once for all of them (attention's q/k/v read the same input), or comes
    quantized (:class:`Quantized`, for modules that :func:`take_quantized`), and one GEMM
    computes them where :func:`quantize_linears` stored them as a group. A peft adapter
    added around one of our FP8 linears raises (:func:`check_adapters`)."""
    if isinstance(x, Quantized):
        return _quantized_matmuls(x.q, x.scale, modules, x.dtype)

    def unfused():
        return [m(x) for m in modules]

    if len(modules) < 2 or not all(is_quantized(m) for m in modules):
        check_adapters(modules)
        return _plain_matmuls(x, modules) or unfused()
    return call_fused(modules, lambda: _quantized_matmuls(*ops.quantize_fp8(rows(x)), modules, x.dtype), unfused)


def _plain_matmuls(x: torch.Tensor, linears) -> list[torch.Tensor] | None:
    """``[m(x) for m in linears]`` as one ``F.linear`` for plain, unhooked linears of the
    model's dtype that :func:`quantize_linears` stored adjacent (a group it left unquantized,
    e.g. LTX's text k/v); None for any others (:func:`_merged`)."""
    if len(linears) < 2 or not all(_plain(m) and not is_patched(m) and runs_unhooked(m) for m in linears):
        return None
    merged = _merged(linears, [m.bias for m in linears], "weight")
    if merged is None:
        return None
    return list(nn.functional.linear(x, *merged).split([m.out_features for m in linears], dim=-1))


def attention_projections(attn: nn.Module, hidden_states, encoder_hidden_states=None) -> list[torch.Tensor]:
    """A diffusers attention's ``[to_q(x), to_k(context), to_v(context)]`` (context: x for
    self-attention); projections that read one input share its FP8 quantization (:func:`linears`),
    which may come quantized (:class:`Quantized`)."""
    if encoder_hidden_states is None:
        return linears(hidden_states, (attn.to_q, attn.to_k, attn.to_v))
    return linears(hidden_states, (attn.to_q,)) + linears(encoder_hidden_states, (attn.to_k, attn.to_v))


def attention_takes_quantized(attn: nn.Module, processor: type) -> bool:
    """Whether ``attn``'s inputs may come quantized (:class:`Quantized`, written by a norm): its
    processor is our ``processor``, called directly (:func:`~ltx_kernels._patching.attend`: the
    module runs unhooked), its q/k/v projections are our FP8 linears, not fused into one
    ``to_qkv`` (diffusers' fused projections take the dtype input), and nothing else reads the
    input (LTX-2.3's gate logits)."""
    return (isinstance(attn.processor, processor) and runs_unhooked(attn)
            and not getattr(attn, "fused_projections", False) and getattr(attn, "to_gate_logits", None) is None
            and take_quantized((attn.to_q, attn.to_k, attn.to_v)))


def context_takes_quantized(attn: nn.Module) -> bool:
    """Whether a joint attention's (FLUX, SD3) text-stream input may come quantized: its added
    q/k/v projections are our FP8 linears, not fused (with :func:`attention_takes_quantized` or
    our processor called directly for the rest)."""
    return (not getattr(attn, "fused_projections", False) and getattr(attn, "add_q_proj", None) is not None
            and take_quantized((attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)))


def projection_fuses_residual(linear: nn.Module, residual: torch.Tensor, gate: torch.Tensor | None,
                              dropout: nn.Module | None = None, sixteen_bit: bool = False) -> bool:
    """Whether ``residual + gate * dropout(linear(x))`` can be one GEMM (:func:`matmul_gated_residual`):
    ``linear`` is our FP8 linear, or with ``sixteen_bit`` :func:`gemm_writes_residual`, and the
    dropout (if any) does nothing, unhooked, and the gate :func:`fuses_gated_residual`. (The
    16-bit GEMM is taken where it was measured to pay, beside cuBLAS + ``gated_residual``: the
    attention output projections and the feed-forward down projections of the DiT blocks; not
    yet FLUX's joint and single-block projections, where 4608 x 15360 -> 3072 measured slower
    on an H200, 642 against 587 us.)"""
    writes = gemm_writes_residual(linear, residual) if sixteen_bit else take_quantized((linear,))
    return (fuses_gated_residual(residual, gate) and writes
            and (dropout is None or (type(dropout) is nn.Dropout and runs_unhooked(dropout)
                                     and dropout_is_identity(dropout))))


def out_projection_fuses_residual(attn: nn.Module, residual: torch.Tensor, gate: torch.Tensor | None) -> bool:
    """Whether ``residual + gate * attn.to_out(heads)`` can be one GEMM
    (:func:`projection_fuses_residual` of the output projection and its dropout)."""
    return projection_fuses_residual(attn.to_out[0], residual, gate, attn.to_out[1], sixteen_bit=True)


def attention_fuses_residual(attn: nn.Module, processor: type, residual: torch.Tensor,
                             gate: torch.Tensor | None) -> bool:
    """Whether :func:`attention_residual` has the output projection's GEMM write the sum:
    ``attn`` runs our ``processor`` unhooked and :func:`out_projection_fuses_residual`."""
    return (isinstance(attn.processor, processor) and runs_unhooked(attn)
            and out_projection_fuses_residual(attn, residual, gate))


def attention_residual(attn: nn.Module, processor: type, residual: torch.Tensor, gate: torch.Tensor | None,
                       *args, **kwargs) -> torch.Tensor:
    """``residual + gate * attn(*args, **kwargs)`` (no gate: ``residual + attn(...)``). Where
    :func:`attention_fuses_residual`, the processor's ``attention()`` gives the heads and the
    output projection's GEMM writes the sum; else the module, then ``gated_residual``."""
    if attention_fuses_residual(attn, processor, residual, gate):
        return projected_attention_residual(attn, residual, gate, *args, **kwargs)
    return ops.gated_residual(residual, attend(attn, *args, **kwargs), gate)


def projected_attention_residual(attn: nn.Module, residual: torch.Tensor, gate: torch.Tensor | None,
                                 *args, **kwargs) -> torch.Tensor:
    """``residual + gate * attn(*args, **kwargs)`` for an ``attn`` that
    :func:`attention_fuses_residual` (the caller checked): its processor's ``attention()`` gives
    the heads and the output projection's GEMM writes the sum."""
    heads = attn.processor.attention(attn, *args, **kwargs)
    return matmul_gated_residual(heads, attn.to_out[0], residual, gate)


def projected_residual(linear: nn.Module, x: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor,
                       dropout: nn.Module | None = None) -> torch.Tensor:
    """``residual + gate * dropout(linear(x))``: one GEMM writing the sum where
    :func:`projection_fuses_residual`, else the modules, then ``gated_residual``."""
    if projection_fuses_residual(linear, residual, gate, dropout):
        return matmul_gated_residual(x, linear, residual, gate)
    out = linear(x)
    return ops.gated_residual(residual, out if dropout is None else dropout(out), gate)


def dropout_is_identity(dropout: nn.Dropout) -> bool:
    """Whether the dropout passes its input through (eval mode or p = 0): then the GEMMs on
    either side of it may fuse."""
    return not (dropout.training and dropout.p > 0)


def _has_dropout(ff: nn.Module) -> bool:
    return not all(dropout_is_identity(m) for m in ff.net if isinstance(m, nn.Dropout))


def _gelu_up(ff: nn.Module, x: torch.Tensor | Quantized, dtype: torch.dtype) -> torch.Tensor:
    """GELU(up projection(x)) of the FF: the GELU in the GEMM's epilogue, on its fp32 result
    (one pass fewer over the hidden values: quantizing them for the down projection no longer
    computes it; H100, LTX-2B 161 frames' 16128 x 8192 values: 182 -> 136 us a quantization)."""
    proj = ff.net[0].proj
    q, scale = (x.q, x.scale) if isinstance(x, Quantized) else ops.quantize_fp8(rows(x))
    return ops.fp8_linear(q, proj.weight, proj.weight_scale, bias_of(proj, dtype), x_scale=scale, out_dtype=dtype,
                          activation="gelu_tanh")


def _down(ff: nn.Module, hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The FF's down projection of its (activated) hidden values."""
    return _quantized_matmuls(*ops.quantize_fp8(hidden), (ff.net[2],), dtype)[0]


def _feed_forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """diffusers' GELU-tanh ``FeedForward`` with both linears in FP8, the GELU in the up
    projection's GEMM (:func:`_gelu_up`)."""
    gelu, down = self.net[0], self.net[2]

    def unfused():
        return type(self).forward(self, hidden_states, *args, **kwargs)

    check_adapters((gelu.proj, down))
    if _has_dropout(self):
        return unfused()
    dtype = hidden_states.dtype
    return call_fused((gelu, gelu.proj, down), lambda: _down(self, _gelu_up(self, hidden_states, dtype), dtype),
                      unfused)


def feed_forward_takes_quantized(ff: nn.Module) -> bool:
    """Whether ``ff`` is a feed-forward we fused in FP8, running unhooked, whose input may
    come quantized by its producer (:func:`feed_forward_quantized`)."""
    if not (_fusable_feed_forward(ff) and runs_unhooked(ff) and not _has_dropout(ff)):
        return False
    gelu, _, down, *_ = ff.net._modules.values()  # not ModuleList indexing (host time, as above)
    return runs_unhooked(gelu) and take_quantized((gelu.proj, down))


def feed_forward_quantized(ff: nn.Module, x: Quantized) -> torch.Tensor:
    """``ff(x)`` for a feed-forward that :func:`feed_forward_takes_quantized`."""
    return _down(ff, _gelu_up(ff, x, x.dtype), x.dtype)


def feed_forward_gated_residual(ff: nn.Module, x: Quantized, residual: torch.Tensor,
                                gate: torch.Tensor) -> torch.Tensor:
    """``residual + gate * ff(x)`` for a feed-forward that :func:`feed_forward_takes_quantized`,
    with a gate that :func:`fuses_gated_residual`: the down projection's GEMM writes it."""
    return matmul_gated_residual(_gelu_up(ff, x, x.dtype), ff.net[2], residual, gate)


def feed_forward_residual(ff: nn.Module, x: torch.Tensor, residual: torch.Tensor,
                          gate: torch.Tensor | None) -> torch.Tensor:
    """``residual + gate * ff(x)`` for a diffusers ``FeedForward`` in the model's dtype: where it
    runs unhooked, its dropouts do nothing and its down projection :func:`projection_fuses_residual`,
    the down projection's GEMM writes the sum (the activation module, ``ff.net[0]``, computes the
    hidden values as the feed-forward would: patched or not); else the module, then
    ``gated_residual``."""
    from diffusers.models.attention import FeedForward

    if type(ff) is FeedForward and runs_unhooked(ff) and not _has_dropout(ff):
        net = list(ff.net._modules.values())  # (not ModuleList indexing: host time, as above)
        if (len(net) in (3, 4) and all(type(m) is nn.Dropout for m in net[1:2] + net[3:])
                and projection_fuses_residual(net[2], residual, gate, sixteen_bit=True)):
            return matmul_gated_residual(net[0](x), net[2], residual, gate)
    return ops.gated_residual(residual, ff(x), gate)


def _fusable_feed_forward(module: nn.Module) -> bool:
    """A diffusers ``FeedForward`` of GELU(tanh) -> Dropout -> Linear (-> Dropout), both linears
    ours in FP8."""
    from diffusers.models.activations import GELU
    from diffusers.models.attention import FeedForward

    if type(module) is not FeedForward:
        return False
    # The ModuleList's modules read once (its indexing, and a slice that builds a new
    # ModuleList, cost ~10 us of host time a call: this runs at every block's call).
    net = list(module.net._modules.values())
    if len(net) not in (3, 4):
        return False
    gelu, drop, down = net[0], net[1], net[2]
    return (type(gelu) is GELU and gelu.approximate == "tanh" and is_quantized(gelu.proj)
            and type(drop) is nn.Dropout and is_quantized(down)
            and all(type(m) is nn.Dropout for m in net[3:]))


def _why_not(module: nn.Linear) -> str | None:
    if module.in_features % 16 or module.out_features % 16:
        return f"{module.in_features} -> {module.out_features} features, not multiples of 16 (the FP8 GEMM's)"
    if module.weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"weight in {module.weight.dtype}"
    return None


def _inside_adapters(model: nn.Module) -> dict[int, str]:
    """{id: why} of the linears inside a peft adapter layer (its base layer and its LoRA
    matrices): peft merges (fuse_lora) and scales them in the weight's dtype, which FP8
    weights cannot take, so they stay in the model's dtype."""
    found = {}
    for module in model.modules():
        if any(cls.__name__ == "BaseTunerLayer" for cls in type(module).__mro__):
            for sub in module.modules():
                found[id(sub)] = f"inside the peft adapter layer {type(module).__name__}"
    return found


def _storable_together(group: tuple[nn.Linear, ...]) -> bool:
    """Whether a group's weights (and biases) can share one storage: one input size, dtype and
    device, and a bias on each or on none."""
    first = group[0]
    same = all(m.in_features == first.in_features and m.weight.dtype == first.weight.dtype
               and m.weight.device == first.weight.device for m in group)
    if all(m.bias is None for m in group):
        return same
    return same and all(m.bias is not None and m.bias.dtype == first.bias.dtype
                        and m.bias.device == first.bias.device for m in group)


def _plain(module: nn.Module) -> bool:
    """A plain ``nn.Linear`` whose weight is a plain floating-point parameter (not one of ours,
    not another library's tensor subclass, e.g. torchao's)."""
    return (type(module) is nn.Linear and type(module.weight) is nn.Parameter and module.weight.is_floating_point()
            and module.weight.element_size() > 1 and not is_quantized(module))


def _rows_of(group: tuple[nn.Linear, ...], stacked: torch.Tensor) -> list[torch.Tensor]:
    """Each linear's rows of ``stacked`` (the group's tensors concatenated in order), as views."""
    starts = [0]
    for m in group:
        starts.append(starts[-1] + m.out_features)
    return [stacked[lo:hi] for lo, hi in zip(starts, starts[1:])]


def _store_biases_together(group: tuple[nn.Linear, ...]) -> None:
    if len(group) > 1 and group[0].bias is not None:
        for m, b in zip(group, _rows_of(group, torch.cat([m.bias.detach() for m in group]))):
            m.bias = nn.Parameter(b, requires_grad=m.bias.requires_grad)


def _store_together(group: tuple[nn.Linear, ...]) -> None:
    """Moves a group's weights (and biases) into one storage each, the modules' parameters
    views of their rows (same values and dtype)."""
    for m, w in zip(group, _rows_of(group, torch.cat([m.weight.detach() for m in group]))):
        m.weight = nn.Parameter(w, requires_grad=m.weight.requires_grad)
    _store_biases_together(group)


def _quantize(group: tuple[nn.Linear, ...]) -> int:
    """Quantizes the group's weights (one linear, or a group :func:`_storable_together`) into
    one storage, each linear's weight, scale (and bias, for a group) a view of its rows;
    patches their forward. Returns the bytes of the FP8 weights and scales."""
    quantized = [ops.quantize_fp8(m.weight.detach()) for m in group]
    weights = torch.cat([q for q, _ in quantized])
    scales = torch.cat([s for _, s in quantized])
    for m, w, s in zip(group, _rows_of(group, weights), _rows_of(group, scales)):
        m.weight = nn.Parameter(w, requires_grad=False)
        m.register_buffer("weight_scale", s)
        patch(m, _forward)
        m.__dict__[MARKER] = True
    _store_biases_together(group)
    return weights.numel() + scales.numel() * 4


def quantize_linears(model: nn.Module, skip: tuple[str, ...], report, groups=()) -> None:
    """Quantizes every plain ``nn.Linear`` of ``model`` whose qualified name matches no pattern
    of ``skip`` (fnmatch); records what it did and the weight memory in ``report``. ``groups``:
    tuples of linears computed from one input (a family's ``projection_groups``); a group that
    is quantized whole, or kept whole in the model's dtype, gets its weights (scales) and biases
    stored adjacent, in its order, so that :func:`linears` computes it in one GEMM."""
    in_adapters = _inside_adapters(model)
    chosen = {}
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or is_quantized(module) or any(fnmatch.fnmatch(name, p) for p in skip):
            continue
        why = _why_not(module) or in_adapters.get(id(module))
        if why is not None:
            report.skipped.append(f"{type(model).__name__}.{name} stays bf16 under fp8: {why}")
            continue
        chosen[id(module)] = module
    before = sum(m.weight.numel() * m.weight.element_size() for m in chosen.values())
    if chosen:
        report.patched[KIND] += len(chosen)
    after = 0
    grouped = set()  # (a linear joins the first group it fits)
    stored = {"FP8": 0, "in the model's dtype": 0}
    for group in groups:
        if not _storable_together(group) or any(id(m) in grouped for m in group):
            continue
        if all(id(m) in chosen for m in group):
            after += _quantize(tuple(chosen.pop(id(m)) for m in group))
            stored["FP8"] += 1
        elif not any(id(m) in chosen for m in group) and all(_plain(m) for m in group):
            _store_together(group)  # kept in the model's dtype (fp8_skip): still one GEMM
            stored["in the model's dtype"] += 1
        else:
            continue
        grouped |= {id(m) for m in group}
    if grouped:
        report.notes.append(f"{type(model).__name__}: projections of one input computed as one GEMM each (their "
                            f"weights stored adjacent): " + ", ".join(f"{n} groups {kind}" for kind, n in stored.items()
                                                                      if n))
    for module in chosen.values():
        after += _quantize((module,))
    for module in model.modules():
        if not is_patched(module) and _fusable_feed_forward(module):
            patch(module, _feed_forward)
            report.patched[FF_KIND] += 1
    if before:
        report.notes.append(
            f"{type(model).__name__}: FP8 weights {before / 2**30:.2f} GiB -> {after / 2**30:.2f} GiB (scales included); "
            "one-way: the original weights were freed, remove() raises"
        )

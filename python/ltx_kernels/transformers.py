"""One-call transformers integration: ``report = apply(model)``, ``remove(model)``.

For the decoder-only families below (dispatched on ``config.model_type``), ``apply`` patches
module instances of an already-built model:

- every ``<Family>RMSNorm`` -> ``rms_norm`` (Gemma's ``(1 + weight)`` as ``weight_offset=1``);
- each decoder layer: ``residual + attn`` and ``post_attention_layernorm`` as one
  ``fused_add_rms_norm`` (the sum is stored once and normalized from the same rounded value);
- the gated MLP: ``act(gate_proj(x)) * up_proj(x)`` as one ``silu_and_mul`` /
  ``gelu_tanh_and_mul`` / ``gelu_and_mul``, as ``config.hidden_act`` says, and with a plain
  ``down_proj`` the activation and the down projection as one ``glu_linear`` (the same
  computation; in training its backward recomputes the activation, which autograd no longer
  keeps: an MLP's saved activations 3 -> 2 intermediate-sized tensors);
- attention: the rotary embedding applied by ``apply_rotary_pos_emb`` on the projections in
  place, with the cos/sin the model's own rotary module computed (so rope scaling such as
  Llama-3's is whatever the model does), GQA included; Qwen3's q/k norms stay, patched as
  norms. The attention itself stays on transformers' attention interface (sdpa, flash, ...)
  and the KV cache on ``past_key_values.update``; one exception, a decode step on SDPA (a few
  query rows per kv head against a long cache, on CUDA, not in training): there
  ``ltx_kernels.attention``'s decode kernel reads the cache once per kv head, where stock
  copies it once per query head (``repeat_kv``).

Every op is fp32 math with one rounding where stock rounds after each step, so patched
outputs are no further from fp32 than stock's. For other architectures only modules whose
class name ends in ``RMSNorm`` are patched, each after checking on a random input that our
op computes what its own forward does (plain or ``(1 + weight)``); the report says so.
Patches are per instance, trace without graph breaks under ``torch.compile(fullgraph=True)``
and are undone by :func:`remove`. They compose, in either order, with peft LoRA adapters
(projections are called as modules) and accelerate's offload hooks (``device_map`` offload,
``dispatch_model``, ``cpu_offload``: patches go beneath the hooks, and the norm weight that
the fused residual + norm reads is read between its hooks, see :mod:`ltx_kernels._patching`),
and with a static cache and ``generate``'s compiled decoding. ``precision="fp8"`` on an
offloaded model, or a LoRA adapter added after it, raises an error naming both.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import warnings
from typing import Iterator

import torch
from torch import nn

from ltx_kernels import _causal_lm_loss, _fp8, ops
from ltx_kernels._forwards import eps_of, gemma_rms_norm_forward, layer_norm_forward, rms_norm_forward
from ltx_kernels._patching import (
    Report,
    call_fused,
    is_patched,
    nothing_to_patch,
    patch,
    runs_unhooked,
    unpatch_all,
    unsupported_reason,
)
from ltx_kernels.integrations.transformers import causal, falcon

# transformers 5 moved the decoder layers to returning one tensor and the attention to the
# `ALL_ATTENTION_FUNCTIONS` interface; 4.x modules have other signatures.
SUPPORTED_VERSIONS = (5, 6)  # [major_min, major_max)

# model_type -> class-name prefix in transformers.models.<package>.modeling_<package> (the
# package is the model_type unless _MODULES says otherwise)
FAMILIES = {
    "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma",
    "gemma2": "Gemma2", "gemma3_text": "Gemma3", "phi3": "Phi3",
}  # fmt: skip
_MODULES = {"gemma3_text": "gemma3"}
# Families whose decoder layer is Llama's (norm, attention, residual add, norm, MLP, residual
# add): it runs the residual add and the post-attention norm as one fused_add_rms_norm. Gemma 2
# and 3 norm the attention and MLP outputs before each residual add (four norms per layer):
# their decoder layers stay stock, with each norm, the attention's RoPE and the MLP patched; so
# do Phi-3's, which apply a residual dropout before each add.
_FUSED_DECODER_LAYERS = ("llama", "mistral", "qwen2", "qwen3", "gemma")
# The config attribute naming the MLP's activation (Gemma 2 and 3 read hidden_activation).
_ACTIVATION_ATTRIBUTE = {"gemma2": "hidden_activation", "gemma3_text": "hidden_activation"}
# Architectures whose LayerNorms are patched (torch.nn.LayerNorm -> layer_norm), with their own
# module for the rest (Falcon: integrations.transformers.falcon, its causal attention; its GELU
# MLP stays stock).
LAYER_NORM_MODEL_TYPES = ("falcon",)
# Gemma's RMSNorm scales by (1 + weight) in fp32 and rounds once.
_WEIGHT_OFFSET = {"gemma": 1.0, "gemma2": 1.0, "gemma3_text": 1.0}
# The norm forward for each weight_offset (the one the Kernels Hub layers run too).
_NORM_FORWARDS = {0.0: rms_norm_forward, 1.0: gemma_rms_norm_forward}

# The gated activation of each config value, as glu_linear names it (its op: <name>_and_mul).
_GATED_ACTIVATIONS: dict[str, str] = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",  # the same tanh approximation, written out
    "gelu": "gelu",
}


def check_version(version: str | None = None) -> None:
    """Raises RuntimeError unless ``transformers`` is a version whose modules we patch."""
    if version is None:
        import transformers

        version = transformers.__version__
    if not (isinstance(version, str) and version.split(".")[0].isdigit()):
        raise ValueError(f"check_version: version must be a version string such as '5.17.0', got {version!r}")
    major = int(version.split(".")[0])
    low, high = SUPPORTED_VERSIONS
    if not low <= major < high:
        raise RuntimeError(
            f"ltx_kernels.transformers patches transformers {low}.x modules "
            f"(tested with 5.17 and 5.23); found transformers {version}. "
            f"Install 'transformers>={low},<{high}' or leave the model unpatched."
        )


# Forwards installed on module instances. Each reads the module's own attributes, as the stock
# forward does, so `.to()`, offload hooks and weight updates keep working. The norms run
# ltx_kernels._forwards' (their mixed-precision policy is written there).


def _decoder_layer_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.LongTensor | None = None,
    past_key_values=None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs,
) -> torch.Tensor:
    residual = hidden_states
    dtype = hidden_states.dtype
    offset = self._ltx_weight_offset
    # Under FP8, a norm whose consumers are all our FP8 linears (q/k/v; gate/up) writes its
    # output quantized: one pass, no dtype copy.
    norm = self.input_layernorm
    if _takes_quantized(self.self_attn, ("q_proj", "k_proj", "v_proj")) and norm.weight.dtype == dtype:
        x = hidden_states
        hidden_states = call_fused(
            (norm,),
            lambda: _fp8.Quantized(
                *ops.rms_norm_fp8(x, norm.weight, eps_of(norm), weight_offset=offset), dtype),
            lambda: _fp8.Quantized(*ops.quantize_fp8(norm(x)), dtype),
        )
    else:
        hidden_states = norm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    norm = self.post_attention_layernorm
    attn_output = hidden_states

    def unfused():  # the sum, then the norm called as a module (its hooks, its forward)
        added = residual + attn_output
        return norm(added), added

    if (norm.weight.dtype == attn_output.dtype == residual.dtype
            and _takes_quantized(self.mlp, ("gate_proj", "up_proj"))):
        def unfused_fp8():
            hidden, added = unfused()
            return (*ops.quantize_fp8(hidden), added)

        q, scale, residual = call_fused(
            (norm,),
            lambda: ops.fused_add_rms_norm_fp8(attn_output, residual, norm.weight, eps_of(norm), weight_offset=offset),
            unfused_fp8,
        )
        hidden_states = _fp8.Quantized(q, scale, attn_output.dtype)
    elif norm.weight.dtype == attn_output.dtype == residual.dtype:  # not so under autocast
        # The norm's weight is read in place, between the norm's hooks (accelerate's offload
        # hooks load it from the meta device: device_map offload, cpu_offload).
        hidden_states, residual = call_fused(
            (norm,),
            lambda: ops.fused_add_rms_norm(attn_output, residual, norm.weight, eps_of(norm), weight_offset=offset),
            unfused,
        )
    else:
        hidden_states, residual = unfused()
    return residual + self.mlp(hidden_states)


def _takes_quantized(module: nn.Module, linears: tuple[str, ...]) -> bool:
    """Whether ``module`` (attention, MLP) may get its input quantized by the norm before it:
    its forward is our patch (which passes the input to those linears only), running
    unhooked, and the linears are our FP8 linears, unhooked."""
    return (is_patched(module) and runs_unhooked(module)
            and _fp8.take_quantized(tuple(getattr(module, name) for name in linears)))


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if hasattr(self, "gate_up_proj"):  # Phi-3: one projection, [gate | up], read as two views
        gate, up = _fp8.linears(x, (self.gate_up_proj,))[0].chunk(2, dim=-1)
    else:
        gate, up = _fp8.linears(x, (self.gate_proj, self.up_proj))  # one FP8 quantization of x
    activation, down = self._ltx_gated_activation, self.down_proj

    def unfused():
        return _fp8.linears(getattr(ops, f"{activation}_and_mul")(gate, up), (down,))[0]

    # The activation and a plain down projection as one glu_linear, whose backward recomputes the
    # activation instead of keeping it; our FP8 linear, a LoRA layer, autocast or a weight
    # stored in another dtype (layerwise casting) take the two calls.
    if (type(down) is not nn.Linear or _fp8.is_quantized(down) or down.weight.dtype != gate.dtype
            or torch.is_autocast_enabled(gate.device.type)):
        return unfused()
    return call_fused((down,), lambda: ops.glu_linear(gate, up, down.weight, down.bias, activation), unfused)


def _attention_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None,
    past_key_values=None,
    **kwargs,
):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    # [B, S, H, Dh] views of the projections: the rotary op reads them in place.
    if hasattr(self, "qkv_proj"):  # Phi-3: one projection, split as its forward splits it
        kv_size = self.config.num_key_value_heads * self.head_dim
        query, key, value = _fp8.linears(hidden_states, (self.qkv_proj,))[0].split(
            [self.config.num_attention_heads * self.head_dim, kv_size, kv_size], dim=-1)
    else:
        query, key, value = _fp8.linears(hidden_states, (self.q_proj, self.k_proj, self.v_proj))
    query, key = query.view(hidden_shape), key.view(hidden_shape)
    value = value.view(hidden_shape).transpose(1, 2)
    if self._ltx_qk_norm:
        query, key = self.q_norm(query), self.k_norm(key)
    cos, sin = position_embeddings
    query, key = ops.apply_rotary_pos_emb(query, key, cos, sin, unsqueeze_dim=2)
    query, key = query.transpose(1, 2), key.transpose(1, 2)

    if past_key_values is not None:
        key, value = past_key_values.update(key, value, self.layer_idx)
    window = self._ltx_sliding_window(self)
    # The model found the mask to be the plain causal one (integrations.transformers.causal):
    # without it SDPA runs is_causal. A sliding window at least as long as the keys masks
    # nothing more; a bidirectional layer (is_causal False) keeps its mask.
    if (kwargs.pop(causal.CAUSAL_KWARG, False) and getattr(self, "is_causal", True)
            and (window is None or key.shape[-2] <= window)):
        attention_mask = None

    attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, self._ltx_eager_attention
    )
    if not self.training and _decodes_on_our_kernel(self, attention_interface, query, key, attention_mask, kwargs):
        attn_output = ops.attention(query, key, value, scale=self.scaling, attn_mask=attention_mask)
        attn_output = attn_output.transpose(1, 2).reshape(*input_shape, -1)  # (a view: laid out [B, S, H, D])
        return _fp8.linears(attn_output, (self.o_proj,))[0], None
    attn_output, attn_weights = attention_interface(
        self,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        sliding_window=window,
        # Gemma 2 caps the attention logits (softcap * tanh(logits / softcap)); only its
        # attention passes the argument, as its stock forward does
        **({"softcap": self.attn_logit_softcapping} if self._ltx_softcap else {}),
        **kwargs,
    )
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return _fp8.linears(attn_output, (self.o_proj,))[0], attn_weights


def _decodes_on_our_kernel(self: nn.Module, attention_interface, query: torch.Tensor, key: torch.Tensor,
                           attention_mask, kwargs: dict) -> bool:
    """Whether this call is transformers' SDPA attention of a decode step that our attention's
    decode kernel takes (ops/attention_workspace.h: at most 16 query rows per kv head, tokens
    times grouped query heads, against 512 keys or more; bf16/fp16 on CUDA, head dim 64 or
    128), with a 4-D mask, or none for one token (SDPA then attends to every key, as ours
    does; several tokens without a mask would be SDPA's is_causal). There stock SDPA repeats the
    keys and values per query head (``repeat_kv``: a mask rules out SDPA's own grouped heads),
    copying the whole cache each step (Llama-3-8B dims, 4 layers, one token against 8192 on an
    H100: 0.60 of the step's 2.04 ms of kernels), and its kernels run one block per (batch,
    head); ours reads the cache once per kv head, split across the GPU."""
    _, heads, tokens, dim = query.shape
    if (not query.is_cuda or query.dtype not in (torch.bfloat16, torch.float16) or dim not in (64, 128)
            or tokens * (heads // key.shape[1]) > ops.ATTENTION_DECODE_ROWS
            or key.shape[2] < ops.ATTENTION_DECODE_MIN_KEYS):
        return False  # (prefill: no import on its path)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask_fits = tokens == 1 if attention_mask is None else attention_mask.dim() == 4
    return (attention_interface is sdpa_attention_forward and not self._ltx_softcap and mask_fits
            and not kwargs.get("output_attentions", False) and kwargs.get("position_bias") is None)


def _sliding_window_of_config(attention: nn.Module) -> int | None:
    return getattr(attention.config, "sliding_window", None)  # Mistral, Phi-3: one for all layers


def _sliding_window_of_layer(attention: nn.Module) -> int | None:
    return getattr(attention, "sliding_window", None)  # Qwen2/3: per layer type; Llama, Gemma: none


# Patching.


def _probe_norm(module: nn.Module) -> float | str:
    """The ``weight_offset`` with which ``rms_norm`` computes what ``module``'s own forward
    computes on a random fp32 input, or why none does."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or weight.device.type == "meta":
        return "no 1-D weight to check the norm with"
    try:
        eps = eps_of(module)
    except (AttributeError, TypeError, ValueError) as error:  # none, or not a number >= 0
        return str(error)
    probe = copy.deepcopy(module).float().cpu()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, weight.numel(), generator=generator)
    with torch.no_grad():
        probe.weight.copy_(torch.randn(weight.numel(), generator=generator))
        expected = type(probe).forward(probe, x)
        for offset in (0.0, 1.0):
            ours = ops.rms_norm(x, probe.weight, eps, weight_offset=offset)
            if expected.shape == ours.shape and torch.allclose(expected, ours, rtol=1e-4, atol=1e-5):
                return offset
    return "its forward is neither x * rsqrt(mean(x^2) + eps) * weight nor * (1 + weight)"


def _patch_family(model: nn.Module, model_type: str, report: Report) -> None:
    package = _MODULES.get(model_type, model_type)
    modeling = sys.modules[f"transformers.models.{package}.modeling_{package}"]
    prefix = FAMILIES[model_type]
    classes = {
        kind: getattr(modeling, prefix + kind) for kind in ("RMSNorm", "DecoderLayer", "Attention", "MLP")
    }
    offset = _WEIGHT_OFFSET.get(model_type, 0.0)
    activation_attribute = _ACTIVATION_ATTRIBUTE.get(model_type, "hidden_act")
    activation_name = getattr(model.config, activation_attribute, None)
    activation = _GATED_ACTIVATIONS.get(activation_name)
    sliding_window = _sliding_window_of_config if model_type in ("mistral", "phi3") else _sliding_window_of_layer

    for name, module in model.named_modules():
        kind = next((k for k, cls in classes.items() if type(module) is cls), None)
        if kind == "RMSNorm":
            patch(module, _NORM_FORWARDS[offset])
            report.patched["RMSNorm (rms_norm)"] += 1
        elif kind == "DecoderLayer" and model_type in _FUSED_DECODER_LAYERS:
            norms = (module.input_layernorm, module.post_attention_layernorm)
            if not all(type(n) is classes["RMSNorm"] for n in norms):
                report.skipped.append(f"{name}: decoder layer norms are not {prefix}RMSNorm")
                continue
            patch(module, _decoder_layer_forward, _ltx_weight_offset=offset)
            report.patched["decoder layer residual + post-attention norm (fused_add_rms_norm)"] += 1
        elif kind == "MLP":
            if activation is None:
                report.skipped.append(f"{name}: no fused gated op for {activation_attribute}={activation_name!r}")
                continue
            patch(module, _mlp_forward, _ltx_gated_activation=activation)
            report.patched[f"gated MLP ({activation}_and_mul)"] += 1
        elif kind == "Attention":
            patch(
                module,
                _attention_forward,
                _ltx_qk_norm=hasattr(module, "q_norm"),
                _ltx_eager_attention=modeling.eager_attention_forward,
                _ltx_sliding_window=sliding_window,
                _ltx_softcap=model_type == "gemma2",
            )
            report.patched["attention rotary embedding (apply_rotary_pos_emb)"] += 1
    # The decoder stack (Gemma 3's text model is Gemma3TextModel), whose causal mask SDPA can
    # take as is_causal: our attention forwards above drop it.
    causal.patch_model(model, getattr(modeling, prefix + "TextModel", None) or getattr(modeling, prefix + "Model"),
                       report)


def _patch_layer_norms(model: nn.Module, model_type: str, report: Report) -> None:
    report.notes.append(f"model_type {model_type!r}: its LayerNorms run layer_norm; its MLP stays stock")
    for name, module in model.named_modules():
        if type(module) is not nn.LayerNorm:
            continue
        if len(module.normalized_shape) != 1:
            report.skipped.append(f"{name}: LayerNorm over {tuple(module.normalized_shape)} (last dim only)")
            continue
        patch(module, layer_norm_forward)
        report.patched["LayerNorm (layer_norm)"] += 1


def _patch_norms_by_class_name(model: nn.Module, model_type: str, report: Report) -> None:
    report.skipped.append(
        f"model_type {model_type!r} is not one of {sorted(FAMILIES)}: only RMSNorm modules "
        "(by class name, each checked against its own forward) were patched"
    )
    for name, module in model.named_modules():
        if not type(module).__name__.endswith("RMSNorm"):
            continue
        found = _probe_norm(module)
        if isinstance(found, str):
            report.skipped.append(f"{name} ({type(module).__name__}): {found}")
            continue
        patch(module, _NORM_FORWARDS[found])
        report.patched["RMSNorm (rms_norm)"] += 1


def _model_type(fn: str, model) -> str:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not isinstance(model, nn.Module) or model_type is None:
        raise TypeError(f"{fn}: model must be a transformers PreTrainedModel with a config, got {type(model).__name__}")
    return model_type


def _nothing_to_patch(model: nn.Module, model_type: str, precision: str) -> bool:
    """Whether apply would change nothing: not a family of ours, no module named *RMSNorm, bf16."""
    return (model_type not in FAMILIES and model_type not in LAYER_NORM_MODEL_TYPES and precision == "bf16"
            and not any(type(m).__name__.endswith("RMSNorm") for m in model.modules()))


def apply(model: nn.Module, precision: str = "bf16", fp8_skip=_fp8.DEFAULT_LLM_FP8_SKIP,
          strict: bool = True) -> Report:
    """Patches a transformers model (``LlamaForCausalLM``, ``Qwen3Model``, ...) in place.

    Returns a :class:`~ltx_kernels._patching.Report` of what was patched; what was left
    alone is in ``report.skipped`` and warned about. Applying twice patches nothing new.

    ``precision="fp8"`` also runs every ``nn.Linear`` but those matching ``fp8_skip`` (fnmatch
    on qualified names; default: the ``lm_head``) in FP8, as ``ltx_kernels.diffusers.inject``
    does: weights quantized once per output channel (one-way: :func:`remove` then raises),
    activations per token, q/k/v and gate/up sharing one quantization of their input. It pays
    in prefill; decode at small batch is bound by reading the weights, which FP8 halves, and
    by launches, which it does not change. Compute capability >= 8.9 on CUDA.

    A ``*ForCausalLM`` in train mode called with ``labels`` computes its loss with
    :func:`~ltx_kernels.fused_linear_cross_entropy` from the hidden states and returns
    ``logits=None`` (the ``[tokens, vocab]`` logits are never built); see
    ``ltx_kernels._causal_lm_loss`` for when it stays stock.

    Falcon (``model_type="falcon"``): its ``torch.nn.LayerNorm`` modules run ``layer_norm``; with
    rotary embeddings, a call whose mask is the plain causal one (no padding, an empty cache)
    runs its attention as SDPA's causal FlashAttention over grouped heads, with our
    ``apply_rotary_pos_emb``, instead of a materialized mask that sends multi-query attention to
    SDPA's math backend (:mod:`ltx_kernels.integrations.transformers.falcon`); any other call,
    and ALiBi models, run stock's attention. Its MLP stays stock (said in ``report.notes``).

    A model apply would not change (a model_type outside the families above, no ``*RMSNorm``
    module, ``precision="bf16"``) raises a ValueError naming its class, model_type and the
    supported ones, before anything changes; ``strict=False`` makes that a warning and returns
    an empty report.
    """
    check_version()
    model_type = _model_type("apply", model)
    precision = ops._choice("apply", "precision", precision, _fp8.PRECISIONS)
    fp8_skip = ops._strings("apply", "fp8_skip", fp8_skip)
    strict = ops._flag("apply", "strict", strict)
    _fp8.check_precision(model, precision)
    if _nothing_to_patch(model, model_type, precision):
        message = (f"apply: nothing to patch in {type(model).__name__} (model_type {model_type!r}): ltx_kernels "
                   f"supports the model types {', '.join(sorted(FAMILIES))} and {', '.join(LAYER_NORM_MODEL_TYPES)} "
                   "(its LayerNorms and causal attention), RMSNorm modules of any model, and "
                   "any model's linears with precision='fp8'")
        return nothing_to_patch("transformers", message, strict)
    report = Report()
    if any(is_patched(m) for m in model.modules()):
        report.skipped.append("already patched by ltx_kernels: nothing new patched")
    elif (problem := unsupported_reason(model)) is not None:
        report.skipped.append(f"{type(model).__name__}: {problem}")
    else:
        if model_type in FAMILIES:
            _patch_family(model, model_type, report)
            _causal_lm_loss.patch_causal_lm(model, report)
        elif model_type in LAYER_NORM_MODEL_TYPES:
            _patch_layer_norms(model, model_type, report)
            falcon.patch_attention(model, report)
        else:
            _patch_norms_by_class_name(model, model_type, report)
        if precision == "fp8":
            _fp8.quantize_linears(model, fp8_skip, report)
    report.note_training(model)
    for reason in report.skipped:
        warnings.warn(f"ltx_kernels.transformers.apply: {reason}", stacklevel=2)
    return report


def remove(model: nn.Module) -> int:
    """Restores every module that :func:`apply` patched; returns how many. A model patched with
    ``precision="fp8"`` cannot be restored (its weights were quantized): that raises, and
    nothing is changed."""
    _model_type("remove", model)
    _fp8.check_removable(model)
    return unpatch_all(model)


@contextlib.contextmanager
def applied(model: nn.Module) -> Iterator[Report]:
    """``with applied(model) as report:`` patched inside, stock again after."""
    report = apply(model)
    try:
        yield report
    finally:
        remove(model)

"""One-call diffusers integration: ``report = inject(pipe)``, ``remove(pipe)``.

``inject`` patches module instances of the pipeline's diffusers models (or of one model):

- ``LTXVideoTransformer3DModel``: its blocks run the fused LTX block of
  :mod:`ltx_kernels.integrations.diffusers.ltx_video` (AdaLN norms, QK-norm + RoPE with
  in-kernel angles, gated residuals fused with the next norm, fused output norm);
- ``FluxTransformer2DModel``: its double- and single-stream blocks run the fused forwards of
  :mod:`ltx_kernels.integrations.diffusers.flux` (gated residuals, norm2 + modulation, the
  single blocks' GELU projection);
- ``SD3Transformer2DModel`` (SD3, SD3.5): its joint blocks
  (:mod:`ltx_kernels.integrations.diffusers.sd3`);
- ``WanTransformer3DModel`` (Wan 2.1 / 2.2): its blocks' norms + modulation, gated residuals
  and self-attention RoPE (:mod:`ltx_kernels.integrations.diffusers.wan`);
- ``PixArtTransformer2DModel`` / ``DiTTransformer2DModel``: their blocks' norms + modulation
  and gated residuals (:mod:`ltx_kernels.integrations.diffusers.dit`);
- any model, by class: diffusers ``AdaLayerNormZero`` / ``AdaLayerNormZeroSingle`` (FLUX, SD3,
  ...) -> ``adaln_layer_norm`` after the module's own modulation linear; diffusers ``RMSNorm`` (with or without weight, without bias) and
  ``torch.nn.RMSNorm`` -> ``rms_norm``; diffusers ``GELU(approximate="tanh")`` ->
  ``linear_gelu_tanh`` (the projection with the GELU in its epilogue); diffusers ``GEGLU`` (``hidden * gelu(gate)``, exact GELU, hidden first) ->
  ``gelu_and_mul(gate, hidden)``; diffusers ``SwiGLU`` -> ``silu_and_mul(gate, hidden)``.

Attention is diffusers' to dispatch: importing this module registers ``ltx_kernels.attention``
as two of its attention backends, ``"ltx_kernels"`` and ``"ltx_kernels_8bit"``
(:mod:`ltx_kernels._diffusers_attention`), which ``inject(..., attention=...)`` sets on a model's
attention processors, and ``set_attention_backend`` / ``attention_backend(...)`` select too.

Text encoders (transformers models) are left to :mod:`ltx_kernels.transformers`. Patches are
per instance and undone by :func:`remove`; they survive ``pipe.to(...)``, work before or after
diffusers' hooks (``enable_cache`` with any cache config, ``enable_layerwise_casting``,
``enable_group_offload``) and ``enable_model_cpu_offload()`` /
``enable_sequential_cpu_offload()`` (see :mod:`ltx_kernels._patching`), and trace without
graph breaks under ``torch.compile(fullgraph=True)`` and ``compile_repeated_blocks``.
The norms and the GELU-tanh projection run the forwards of :mod:`ltx_kernels._forwards`, the
same as the Kernels Hub layers': a norm whose weight is kept in fp32 beside 16-bit activations
runs our kernel too, with the stock forward's output dtype (the policy in that module).
"""

from __future__ import annotations

import contextlib
import glob
import warnings
from typing import Iterator

import torch
from torch import nn

from ltx_kernels import _diffusers_attention, _fp8, ops
from ltx_kernels._forwards import linear_gelu_tanh_forward, rms_norm_forward
from ltx_kernels._patching import (
    Report,
    is_library_owned,
    is_patched,
    library_owned_modules,
    nothing_to_patch,
    patch,
    unpatch_all,
    unsupported_reason,
)
from ltx_kernels.integrations.diffusers import family_of, flux, model_class_names
from ltx_kernels.integrations.family import PatchOptions

# Our attention backends join diffusers' dispatcher on import (False without diffusers).
_ATTENTION_REGISTERED = _diffusers_attention.register()


def _geglu_forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    hidden, gate = self.proj(hidden_states).chunk(2, dim=-1)
    return ops.gelu_and_mul(gate, hidden)


def _swiglu_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    hidden, gate = self.proj(hidden_states).chunk(2, dim=-1)
    return ops.silu_and_mul(gate, hidden)


def _generic_patch(module: nn.Module):
    """(kind, forward) for a module patchable by class, (None, reason) if its class is known
    but this instance is not supported, or None."""
    from diffusers.models.activations import GEGLU, GELU, SwiGLU
    from diffusers.models.normalization import AdaLayerNormZero, AdaLayerNormZeroSingle, RMSNorm

    for cls, kind, forward in ((AdaLayerNormZero, flux.ADALN_KIND, flux.adaln_zero_forward),
                               (AdaLayerNormZeroSingle, flux.ADALN_SINGLE_KIND, flux.adaln_zero_single_forward)):
        if type(module) is cls:
            why = flux.adaln_zero_problem(module)
            return (None, f"{cls.__name__}: {why}") if why else (kind, forward)

    if isinstance(module, RMSNorm):
        if module.bias is not None:
            return None, "diffusers RMSNorm with bias (no fused op for the bias)"
        return "RMSNorm (rms_norm)", rms_norm_forward
    if isinstance(module, nn.RMSNorm):
        if len(module.normalized_shape) != 1:
            return None, f"torch.nn.RMSNorm over {tuple(module.normalized_shape)} (last dim only)"
        return "torch.nn.RMSNorm (rms_norm)", rms_norm_forward
    if type(module) is GELU:
        if module.approximate != "tanh":
            return None  # exact-erf GELU alone: torch's kernel is already at bandwidth
        return "GELU tanh (linear_gelu_tanh)", linear_gelu_tanh_forward
    if type(module) is GEGLU:
        return "GEGLU (gelu_and_mul)", _geglu_forward
    if type(module) is SwiGLU:
        return "SwiGLU (silu_and_mul)", _swiglu_forward
    return None


def _models(fn: str, pipe_or_model) -> list[nn.Module]:
    if isinstance(pipe_or_model, nn.Module):
        # Any module holding diffusers modules (a model, or the user's own container of them);
        # one with none is a mistake (e.g. a transformers model: see ltx_kernels.transformers).
        if not any(type(m).__module__.startswith("diffusers.") for m in pipe_or_model.modules()):
            raise TypeError(
                f"{fn}: pipe_or_model must be a diffusers pipeline or model, got {type(pipe_or_model).__name__} "
                "holding no diffusers module (transformers models: ltx_kernels.transformers.apply)"
            )
        return [pipe_or_model]
    from diffusers.models.modeling_utils import ModelMixin

    components = getattr(pipe_or_model, "components", None)
    if components is None:
        raise TypeError(
            f"{fn}: pipe_or_model must be a diffusers pipeline or model, got {type(pipe_or_model).__name__}"
        )
    return [c for c in components.values() if isinstance(c, ModelMixin)]


def _supported(model: nn.Module, attention: str | None) -> bool:
    """Whether inject changes anything in ``model``: a model family's class, a module patched
    by class, or (``attention`` given) an attention processor that takes our backend."""
    return (any(family_of(m) is not None or _generic_patch(m) is not None for m in model.modules())
            or (attention is not None and _diffusers_attention.takes_backend(model)))


def inject(
    pipe_or_model, rope: str = "exact", precision: str = "bf16", fp8_skip=_fp8.DEFAULT_FP8_SKIP,
    attention: str | None = None, strict: bool = True,
) -> Report:
    """Patches a diffusers pipeline's models (or one model) in place; returns what was patched.

    ``precision="fp8"`` also runs the ``nn.Linear`` layers in FP8 (:mod:`ltx_kernels._fp8`):
    weights quantized once to e4m3 with per-output-channel scales (the originals freed: one-way,
    :func:`remove` then raises), activations per token; fp32 accumulation. ``fp8_skip`` lists
    fnmatch patterns of qualified module names that stay in the model's dtype (default: the
    input/output projections, timestep and caption embeddings, AdaLN tables, output norm).
    Needs compute capability >= 8.9 on CUDA (checked before the model is touched); on the CPU
    the format is emulated (slow; for tests). Not for training: FP8 is forward-only.

    ``attention``, independent of ``precision``, picks the attention kernel:

    - ``None`` (default): the model's attention backend stays as it is (diffusers' default,
      SDPA, or whatever the user set with ``set_attention_backend``). Where none was chosen,
      LTX-Video's processor runs ``ltx_kernels.attention`` (exact) where it is the faster on
      the GPU at hand: the text cross-attention from sm_80 on (its short-key kernel), and the
      self-attention at head dim 64 (LTX-2B) over at least 1536 tokens on Hopper with a build
      for sm_90a (an LTX-2B FP8 step at 161 frames: 119.2 ms, 130.0 with SDPA); otherwise, and
      in training forwards, SDPA. ``set_attention_backend("native")`` keeps SDPA everywhere.
    - ``"bf16"`` / ``"8bit"``: every attention processor that goes through diffusers' attention
      dispatcher (LTX's, ours, and those of other diffusers models alike) gets the backend
      ``"ltx_kernels"`` (``ltx_kernels.attention``, exact) or ``"ltx_kernels_8bit"`` (q and k in
      INT8 with per-block scales, k smoothed; SageAttention's method). Set per processor, so
      other models keep theirs; ``report.patched`` counts the modules per backend,
      ``report.notes`` says which backend the user had set and this replaced, and
      :func:`remove` gives each processor back what it had. On CUDA the kernel takes bf16/fp16
      with head dim 64 or 128 (others raise at the call, naming the backend); forward-only; it
      works with Ulysses context parallelism, not ring attention (refused here). On an H100
      the exact kernel is 1.13-1.19x SDPA's cuDNN backend at head dim 64 (LTX's shapes), 0.92-0.98x
      at 128 (benchmarks/results/h100/attention.md); an LTX-2B step at 161 frames with FP8
      linears takes 121.8 ms with it, 131.2 with SDPA.

    ``rope`` picks the RoPE angles of LTX-Video and of LTX-2's video self-attention (its audio
    and cross-modal RoPEs, one axis each, always take diffusers' tables):

    - ``"exact"`` (default): computed in the attention kernel from the token positions,
      reduced in fp64, so the ``[B, S, D]`` tables are never built. An fp32 model's output
      then differs from stock diffusers' (on the tiny test models: ~1e-5 relative with
      ``rope_interpolation_scale`` or ``video_coords``, 1e-4 to 3e-4 on the raw grid; more
      on larger latents), and it is the stock side that is off: diffusers forms the angles
      ``freq * (2 * position - 1)`` in fp32, with ``freq`` up to ``theta * pi / 2`` (~1.6e4);
      on the raw grid (no ``rope_interpolation_scale``: positions up to the latent size)
      angles reach ~1e5 rad, where one fp32 rounding is ~1e-2, and its cos/sin tables are
      off by up to 3e-2 for a 3x4x5 latent, 3e-1 for 16x30x40.
    - ``"stock"``: diffusers' own fp32 tables (``model.rope(...)``), applied with ``ltx_rope``:
      an fp32 model then agrees with stock to fp32 rounding (~2e-7 relative), e.g. to check
      a pipeline against stock outputs.

    For LTX-2 the positions are the patches' midpoints over the video rotary module's bases;
    the module still builds its tables (for whatever else receives them: a processor set after
    inject, context parallelism's shards), which the q/k kernel does not read. Its angles are smaller (positions in pixels and seconds over 2048 / 20), so stock's fp32
    tables are off by less: ~1e-5 relative on the output of the tiny test model, against
    ~2e-7 for the exact angles (both vs the fp64 formula).

    A model that inject would not change (none of the families' classes, no module patched by
    class, and no attention processor for ``attention``) raises a ValueError naming its class
    and the supported ones, before anything changes; for a pipeline, only when none of its
    models is supported (the others are listed in ``report.notes``). ``strict=False`` makes
    that a warning and returns an empty report.

    What cannot be patched is listed in ``report.skipped`` and warned about. Calling
    ``inject`` twice patches nothing new (the first call's ``rope`` stays), except that an
    ``attention`` other than None sets that backend.

    Composes with diffusers' hooks in either order (``enable_cache``, layerwise casting,
    group offloading, accelerate's CPU offload): patches go beneath the hooks, and weights a
    fused kernel reads from a submodule are read with that submodule's hooks run around it.
    A projection wrapped by peft (LoRA) is called as a module, so its adapters apply. A
    module whose weight is a library's tensor subclass (a torchao-quantized linear) runs its
    library's forward, read by no fused kernel; ``report.notes`` lists those modules, and
    ``precision="fp8"`` leaves them as they are (listed in ``report.skipped``).
    """
    rope = ops._choice("inject", "rope", rope, ("exact", "stock"))
    precision = ops._choice("inject", "precision", precision, _fp8.PRECISIONS)
    fp8_skip = ops._strings("inject", "fp8_skip", fp8_skip)
    _diffusers_attention.check_arguments(attention, _ATTENTION_REGISTERED)
    strict = ops._flag("inject", "strict", strict)
    models = _models("inject", pipe_or_model)
    unsupported = [m for m in models if not _supported(m, attention)]
    if len(unsupported) == len(models):
        names = ", ".join(type(m).__name__ for m in models) or "no diffusers model"
        message = (f"inject: nothing to patch in {names}: ltx_kernels supports the model classes "
                   f"{', '.join(model_class_names())} and, in any diffusers model, AdaLayerNormZero(Single), "
                   "RMSNorm, GELU(approximate='tanh'), GEGLU, SwiGLU and attention processors that go through "
                   "diffusers' dispatcher (with attention=...)")
        return nothing_to_patch("diffusers", message, strict)
    models = [m for m in models if m not in unsupported]
    report = Report()
    report.notes += [f"{type(m).__name__}: nothing ltx_kernels patches in this model; left as it is"
                     for m in unsupported]
    for model in models:
        _fp8.check_precision(model, precision)
        _diffusers_attention.check_model(model, attention)
    for model in models:
        if any(_fp8.is_quantized(m) for m in model.modules()):  # so precision is "fp8" (check_precision)
            report.skipped.append(f"{type(model).__name__}: already injected with precision='fp8': no kernel "
                                  "patched again")
        else:
            problem = unsupported_reason(model)
            if problem is not None:
                report.skipped.append(f"{type(model).__name__}: {problem}")
                continue
            _patch_kernels(model, PatchOptions(rope=rope), precision, fp8_skip, report)
        if attention is not None:
            _diffusers_attention.use_backend(model, attention, report)
    for reason in report.skipped:
        warnings.warn(f"ltx_kernels.diffusers.inject: not patched: {reason}", stacklevel=2)
    return report


def _patch_kernels(model: nn.Module, options: PatchOptions, precision: str, fp8_skip, report: Report) -> None:
    """inject's kernels (all but the attention backend) on one model of supported dtype and device:
    each model family's patches (:mod:`ltx_kernels.integrations.diffusers`), then the by-class ones."""
    fused: set[int] = set()
    groups: list[tuple[nn.Module, ...]] = []
    for module in model.modules():
        family = family_of(module)
        if family is not None:
            family.patch(module, report, options)
            fused |= {id(m) for m in family.fused(module)}
            groups += family.projection_groups(module)
    for name, module in model.named_modules():
        if id(module) in fused or is_patched(module):
            continue
        found = _generic_patch(module)
        if found is None:
            continue
        kind, forward = found
        if kind is None:
            report.skipped.append(f"{type(model).__name__}.{name}: {forward}")
            continue
        patch(module, forward)
        report.patched[kind] += 1
    skip = tuple(fp8_skip)
    library = library_owned_modules(model)
    if library is not None:  # e.g. torchao-quantized linears: their library computes them
        left = f"{type(model).__name__}: {library}: left to their library"
        if precision == "fp8":
            skip += tuple(glob.escape(n) for n, m in model.named_modules() if is_library_owned(m))
            report.skipped.append(f"{left}, not FP8")
        else:
            report.notes.append(f"{left}; no fused kernel reads their weights (a GELU-tanh projection among "
                                "them runs unfused: its library's linear, then gelu_tanh)")
    if precision == "fp8":
        _fp8.quantize_linears(model, skip, report, groups)
    report.note_training(model)


def remove(pipe_or_model) -> int:
    """Restores every module that :func:`inject` patched, and each attention processor's
    backend (unless set again since); returns how many. A model injected with
    ``precision="fp8"`` cannot be restored (its weights were quantized): that raises, and
    nothing is changed."""
    models = _models("remove", pipe_or_model)
    for model in models:
        _fp8.check_removable(model)
    # Backends first: an LTX processor of ours holds the stock one's until unpatched.
    return sum(_diffusers_attention.restore_backends(model) + unpatch_all(model) for model in models)


@contextlib.contextmanager
def injected(pipe_or_model) -> Iterator[Report]:
    """``with injected(pipe) as report:`` patched inside, stock again after."""
    report = inject(pipe_or_model)
    try:
        yield report
    finally:
        remove(pipe_or_model)

"""PixArt-α / PixArt-Σ (diffusers' ``PixArtTransformer2DModel``) and DiT
(``DiTTransformer2DModel``): their ``BasicTransformerBlock``s, AdaLN-single (PixArt) and
AdaLN-Zero (DiT).

- Each norm + modulation ``norm(x) * (1 + scale) + shift`` is one ``adaln_layer_norm`` pass
  (PixArt's norm1 and norm2 with the block's ``scale_shift_table`` plus the timestep
  embedding; DiT's norm3, its norm1 being an ``AdaLayerNormZero``, patched by class in
  :mod:`.flux`).
- Each ``x + gate * branch`` (self-attention, feed-forward) is one ``gated_residual`` pass.

The feed-forward's GELU-tanh projection is patched by class (``linear_gelu_tanh``); the linears
stay the modules' own, so hooks, LoRA and FP8 linears work on them; a norm with hooks runs
unfused (:func:`.flux.modulate`). The attentions' stock ``AttnProcessor2_0`` takes our processor
(the same steps, q/k/v kept ``[B, S, H, D]``, attention through diffusers' dispatcher) where the
attention is a plain one (no spatial or group norm, no residual connection or output rescale).

Under ``inject(precision="fp8")``, where the modules involved run unhooked: the projections that
read one input share its quantization, norm1's output comes quantized by the norm itself
(``adaln_layer_norm_fp8``), and the self-attention's output projection GEMM writes the gated
residual (:func:`_fp8.attention_residual`), as the feed-forward's down projection does.
"""

from __future__ import annotations

import torch
from torch import nn

from ltx_kernels import _fp8, ops
from ltx_kernels._diffusers_attention import processor_attention
from ltx_kernels._patching import ProcessorOverStock, is_patched, realized
from ltx_kernels.integrations.family import Family

from .flux import (adaln_zero_forward, feed_forward_update, modulate, norm_quantizes, patch_blocks,
                   patch_processors, plain_layer_norm)

BLOCK_KIND = "BasicTransformerBlock, AdaLN-single / AdaLN-Zero (adaln_layer_norm, gated_residual)"
ATTN_KIND = "BasicTransformerBlock attention ([B, S, H, D] layout, diffusers' dispatcher)"


class DiTKernelsAttnProcessor(ProcessorOverStock):
    """diffusers' ``AttnProcessor2_0`` for a plain attention on ``[B, S, D]`` tokens: q, k and v
    in the projections' ``[B, S, H, D]`` layout (under FP8 the projections of one input share its
    quantization, :func:`_fp8.attention_projections`), attention through diffusers' dispatcher.
    A 4-D (image) input takes the stock processor."""

    def __call__(self, attn: nn.Module, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 temb=None, *args, **kwargs):
        if hidden_states.ndim == 4:
            return self._stock(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        out = self.attention(attn, hidden_states, encoder_hidden_states, attention_mask)
        return attn.to_out[1](attn.to_out[0](out))

    def attention(self, attn: nn.Module, hidden_states, encoder_hidden_states=None, attention_mask=None):
        """What ``__call__`` computes before the output projection: the heads' outputs ``[B, S,
        inner_dim]``. ``hidden_states`` may come quantized where
        :func:`_fp8.attention_takes_quantized` (norm1's output under FP8)."""
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch, tokens = context.shape[:2]
        if attention_mask is not None:  # as stock: [B * H, 1 or Sq, Sk] -> [B, H, ., Sk]
            attention_mask = attn.prepare_attention_mask(attention_mask, tokens, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        query, key, value = (t.unflatten(-1, (attn.heads, -1)) for t in
                             _fp8.attention_projections(attn, hidden_states, encoder_hidden_states))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        out = processor_attention(self, query, key, value, attention_mask)
        return out.flatten(2, 3).to(query.dtype)


def _attn_problem(attn: nn.Module) -> str | None:
    from diffusers.models.attention_processor import AttnProcessor2_0

    if type(attn.processor) is not AttnProcessor2_0:
        return f"its processor is {type(attn.processor).__name__} (its attention stays its own)"
    if attn.spatial_norm is not None or attn.group_norm is not None or attn.norm_cross:
        return "it has a spatial, group or cross-attention norm (its attention stays its own)"
    if attn.residual_connection or attn.rescale_output_factor != 1.0:
        return "it adds a residual or rescales its output (its attention stays its own)"
    return None


def _block_forward(self: nn.Module, hidden_states: torch.Tensor, attention_mask=None, encoder_hidden_states=None,
                   encoder_attention_mask=None, timestep=None, cross_attention_kwargs=None, class_labels=None,
                   added_cond_kwargs=None) -> torch.Tensor:
    """``BasicTransformerBlock.forward`` for norm_type "ada_norm_single" and "ada_norm_zero"."""
    # The first block gets the patch embedding's [B, C, S] -> [B, S, C] transpose, a view the
    # fused ops refuse (rows must be contiguous): one copy there, a no-op in later blocks.
    hidden_states = hidden_states.contiguous()
    single = self.norm_type == "ada_norm_single"
    if single:
        # [B, 6, D] -> six per-sample [B, D] vectors
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = realized(
            self.scale_shift_table[None] + timestep.reshape(hidden_states.shape[0], 6, -1)
        ).unbind(1)
    cross_attention_kwargs = dict(cross_attention_kwargs or {})
    gligen_kwargs = cross_attention_kwargs.pop("gligen", None)
    # Under FP8, norm1 writes its output quantized for attn1's q/k/v projections, and attn1's
    # output projection GEMM writes the gated residual (_fp8.attention_residual).
    ours = not cross_attention_kwargs and not self.only_cross_attention
    quantized = ours and _fp8.attention_takes_quantized(self.attn1, DiTKernelsAttnProcessor)
    if single:
        norm_hidden_states = modulate(self.norm1, hidden_states, scale_msa, shift_msa, quantized)
    elif quantized and norm_quantizes(self.norm1):
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = adaln_zero_forward(
            self.norm1, hidden_states, timestep, class_labels, hidden_dtype=hidden_states.dtype, quantized=True)
    else:
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(
            hidden_states, timestep, class_labels, hidden_dtype=hidden_states.dtype
        )
    if ours:
        hidden_states = _fp8.attention_residual(self.attn1, DiTKernelsAttnProcessor, hidden_states, gate_msa[:, None],
                                                norm_hidden_states, None, attention_mask)
    else:
        attn_output = self.attn1(
            norm_hidden_states,
            encoder_hidden_states=encoder_hidden_states if self.only_cross_attention else None,
            attention_mask=attention_mask,
            **cross_attention_kwargs,
        )
        hidden_states = ops.gated_residual(hidden_states, attn_output, gate_msa[:, None])
    if hidden_states.ndim == 4:
        hidden_states = hidden_states.squeeze(1)
    if gligen_kwargs is not None:
        hidden_states = self.fuser(hidden_states, gligen_kwargs["objs"])
    if self.attn2 is not None:
        # (PixArt applies no norm before its cross-attention, as the original model)
        cross_input = hidden_states if single else self.norm2(hidden_states)
        hidden_states = self.attn2(cross_input, encoder_hidden_states=encoder_hidden_states,
                                   attention_mask=encoder_attention_mask, **cross_attention_kwargs) + hidden_states
    norm = self.norm2 if single else self.norm3
    hidden_states = feed_forward_update(hidden_states, norm, self.ff, shift_mlp, scale_mlp, gate_mlp)
    if hidden_states.ndim == 4:
        hidden_states = hidden_states.squeeze(1)
    return hidden_states


def _block_problem(block: nn.Module) -> str | None:
    if block.norm_type not in ("ada_norm_single", "ada_norm_zero"):
        return f"norm_type is {block.norm_type!r} (fused: 'ada_norm_single', 'ada_norm_zero')"
    if block.pos_embed is not None:
        return "it has a positional embedding inside the block"
    if block._chunk_size is not None:
        return "feed-forward chunking is on (set_chunk_feed_forward)"
    norms = ("norm1", "norm2") if block.norm_type == "ada_norm_single" else ("norm3",)
    for name in norms:
        if not plain_layer_norm(getattr(block, name)):
            return f"{name} is not a LayerNorm without affine"
    return None


def _model_classes() -> tuple[type, ...]:
    from diffusers.models.transformers.dit_transformer_2d import DiTTransformer2DModel
    from diffusers.models.transformers.pixart_transformer_2d import PixArtTransformer2DModel

    return (PixArtTransformer2DModel, DiTTransformer2DModel)


def patch_model(model: nn.Module, report, options) -> None:
    """Patches ``model``'s blocks (DiT's AdaLN-Zero norm1 is patched by class)."""
    if any(is_patched(block) for block in model.transformer_blocks):
        return
    blocks = patch_blocks(model, "transformer_blocks", _block_forward, _block_problem, BLOCK_KIND, report)
    for name in ("attn1", "attn2"):
        patch_processors(model, [b for b in blocks if getattr(b, name) is not None], name, _attn_problem,
                         DiTKernelsAttnProcessor, ATTN_KIND, report)


def projection_groups(model: nn.Module) -> list[tuple[nn.Module, ...]]:
    """Each attention of ours: its q/k/v (self-attention: one GEMM; the attention takes them as
    strided views) and its k/v (of the context, in a cross-attention)."""
    return [
        group
        for block in model.transformer_blocks
        for attn in (block.attn1, block.attn2)
        if attn is not None and isinstance(attn.processor, DiTKernelsAttnProcessor)
        for group in ((attn.to_q, attn.to_k, attn.to_v), (attn.to_k, attn.to_v))
    ]


FAMILY = Family("PixArt / DiT", _model_classes, patch_model, projection_groups=projection_groups)

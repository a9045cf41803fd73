"""PixArt-α / PixArt-Σ (diffusers' ``PixArtTransformer2DModel``) and DiT
(``DiTTransformer2DModel``): their ``BasicTransformerBlock``s, AdaLN-single (PixArt) and
AdaLN-Zero (DiT).

- Each norm + modulation ``norm(x) * (1 + scale) + shift`` is one ``adaln_layer_norm`` pass
  (PixArt's norm1 and norm2 with the block's ``scale_shift_table`` plus the timestep
  embedding; DiT's norm3, its norm1 being an ``AdaLayerNormZero``, patched by class in
  :mod:`.flux`).
- Each ``x + gate * branch`` (self-attention, feed-forward) is one ``gated_residual`` pass.

The feed-forward's GELU-tanh projection is patched by class (``linear_gelu_tanh``); attention,
cross-attention and the linears stay the modules' own, so hooks, LoRA and FP8 linears work on
them; a norm with hooks runs unfused (:func:`.flux.modulate`).
"""

from __future__ import annotations

import torch
from torch import nn

from ltx_kernels import ops
from ltx_kernels._patching import is_patched, realized
from ltx_kernels.integrations.family import Family

from .flux import plain_layer_norm, feed_forward_update, modulate, patch_blocks

BLOCK_KIND = "BasicTransformerBlock, AdaLN-single / AdaLN-Zero (adaln_layer_norm, gated_residual)"


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
        norm_hidden_states = modulate(self.norm1, hidden_states, scale_msa, shift_msa)
    else:
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(
            hidden_states, timestep, class_labels, hidden_dtype=hidden_states.dtype
        )
    cross_attention_kwargs = dict(cross_attention_kwargs or {})
    gligen_kwargs = cross_attention_kwargs.pop("gligen", None)
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
    patch_blocks(model, "transformer_blocks", _block_forward, _block_problem, BLOCK_KIND, report)


FAMILY = Family("PixArt / DiT", _model_classes, patch_model)

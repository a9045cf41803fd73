"""Stable Diffusion 3 / 3.5 (diffusers' ``SD3Transformer2DModel``): its ``JointTransformerBlock``s
with each ``x + gate * branch`` as one ``gated_residual`` and norm2 + modulation as one
``adaln_layer_norm`` (:func:`ltx_kernels.integrations.diffusers.flux.feed_forward_update`), for the image stream, the
text stream (absent in the last block, ``context_pre_only``) and SD3.5's second attention
(``use_dual_attention``). The AdaLN-Zero norms are patched by class (:mod:`ltx_kernels.integrations.diffusers.flux`),
QK RMSNorms and the GELU-tanh feed-forwards too; attention stays diffusers'.
"""

from __future__ import annotations

import torch
from torch import nn

from ltx_kernels import ops
from ltx_kernels._patching import is_patched
from ltx_kernels.integrations.family import Family

from .flux import feed_forward_update, patch_blocks, plain_layer_norm

BLOCK_KIND = "JointTransformerBlock (gated_residual, adaln_layer_norm)"


def _block_forward(self: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                   temb: torch.Tensor, joint_attention_kwargs=None):
    joint_attention_kwargs = joint_attention_kwargs or {}
    if self.use_dual_attention:
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm_hidden_states2, gate_msa2 = self.norm1(
            hidden_states, emb=temb
        )
    else:
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
    if self.context_pre_only:
        norm_encoder_hidden_states = self.norm1_context(encoder_hidden_states, temb)
    else:
        norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
            encoder_hidden_states, emb=temb
        )
    attn_output, context_attn_output = self.attn(
        hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states, **joint_attention_kwargs
    )
    hidden_states = ops.gated_residual(hidden_states, attn_output, gate_msa[:, None])
    if self.use_dual_attention:
        attn_output2 = self.attn2(hidden_states=norm_hidden_states2, **joint_attention_kwargs)
        hidden_states = ops.gated_residual(hidden_states, attn_output2, gate_msa2[:, None])
    hidden_states = feed_forward_update(hidden_states, self.norm2, self.ff, shift_mlp, scale_mlp, gate_mlp)
    if self.context_pre_only:
        return None, hidden_states
    encoder_hidden_states = ops.gated_residual(encoder_hidden_states, context_attn_output, c_gate_msa[:, None])
    encoder_hidden_states = feed_forward_update(encoder_hidden_states, self.norm2_context, self.ff_context,
                                                c_shift_mlp, c_scale_mlp, c_gate_mlp)
    return encoder_hidden_states, hidden_states


def _block_problem(block: nn.Module) -> str | None:
    if block._chunk_size is not None:
        return "feed-forward chunking is on (set_chunk_feed_forward)"
    norms = [block.norm2] + ([] if block.context_pre_only else [block.norm2_context])
    if not all(plain_layer_norm(n) for n in norms):
        return "norm2 / norm2_context are not LayerNorms without affine"
    return None


def _model_classes() -> tuple[type, ...]:
    from diffusers.models.transformers.transformer_sd3 import SD3Transformer2DModel

    return (SD3Transformer2DModel,)


def patch_model(model: nn.Module, report, options) -> None:
    """Patches ``model``'s joint blocks (the AdaLN norms are patched by class)."""
    if any(is_patched(block) for block in model.transformer_blocks):
        return
    patch_blocks(model, "transformer_blocks", _block_forward, _block_problem, BLOCK_KIND, report)


FAMILY = Family("Stable Diffusion 3", _model_classes, patch_model)

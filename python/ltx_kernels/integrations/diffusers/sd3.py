"""Stable Diffusion 3 / 3.5 (diffusers' ``SD3Transformer2DModel``): its ``JointTransformerBlock``s
with each ``x + gate * branch`` as one ``gated_residual`` and norm2 + modulation as one
``adaln_layer_norm`` (:func:`ltx_kernels.integrations.diffusers.flux.feed_forward_update`), for the image stream, the
text stream (absent in the last block, ``context_pre_only``) and SD3.5's second attention
(``use_dual_attention``). The AdaLN-Zero norms are patched by class (:mod:`ltx_kernels.integrations.diffusers.flux`),
QK RMSNorms and the GELU-tanh feed-forwards too.

The joint attention (stock ``JointAttnProcessor2_0``) takes our processor: the same steps with
q, k and v kept ``[B, S, H, D]`` as the projections give them. Stock transposes them to
``[B, H, S, D]`` first, so its q/k norms read strided rows, its concatenation of the image and
text tokens gathers three strided tensors, and its attention output is transposed back with a
copy; here the norms read contiguous rows, the concatenation copies contiguous blocks, and the
output is split with no transpose. Attention goes through diffusers' dispatcher, so
``inject(attention=...)`` and ``set_attention_backend`` reach it (stock calls SDPA directly). As
stock, it applies no attention mask.

Under ``inject(precision="fp8")``, where the modules involved run unhooked: the AdaLN-Zero norms
write their outputs quantized for the FP8 linears after them (``adaln_layer_norm_fp8``), each
stream's q/k/v share one quantization, and the block calls our processor for the heads so that
each output projection's FP8 GEMM writes its stream's gated residual, as the feed-forwards' down
projections do (:func:`_fp8.projected_residual`).
"""

from __future__ import annotations

import torch
from torch import nn

from ltx_kernels import _fp8, ops
from ltx_kernels._diffusers_attention import processor_attention
from ltx_kernels._patching import ProcessorOverStock, is_patched, runs_unhooked
from ltx_kernels.integrations.family import Family

from .flux import adaln_zero, feed_forward_update, patch_blocks, patch_processors, plain_layer_norm

BLOCK_KIND = "JointTransformerBlock (gated_residual, adaln_layer_norm)"
ATTN_KIND = "SD3 joint attention ([B, S, H, D] layout, diffusers' dispatcher)"


class SD3KernelsJointAttnProcessor(ProcessorOverStock):
    """diffusers' ``JointAttnProcessor2_0`` with q, k and v in the projections' ``[B, S, H, D]``
    layout (image tokens, then text), attention through diffusers' dispatcher."""

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states=None,
                 attention_mask=None, *args, **kwargs):
        image, context = self.attention(attn, hidden_states, encoder_hidden_states)
        image = attn.to_out[1](attn.to_out[0](image))
        if encoder_hidden_states is None:
            return image
        return image, context if attn.context_pre_only else attn.to_add_out(context)

    def attention(self, attn: nn.Module, hidden_states, encoder_hidden_states=None) -> tuple:
        """What ``__call__`` computes before the output projections: the heads' outputs ``(image,
        context)``, each ``[B, S, inner_dim]`` (context None without ``encoder_hidden_states``),
        so that the block's FP8 GEMMs write the gated residuals. The inputs may come quantized
        (:class:`_fp8.Quantized`, written by the norms) where the projections take them."""
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.unflatten(-1, (attn.heads, -1))

        # (under FP8, projections of one input share its quantization: _fp8.linears)
        query, key, value = (heads(t) for t in _fp8.attention_projections(attn, hidden_states))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if encoder_hidden_states is not None:
            context_query, context_key, context_value = (heads(t) for t in _fp8.linears(
                encoder_hidden_states, (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)))
            if attn.norm_added_q is not None:
                context_query = attn.norm_added_q(context_query)
            if attn.norm_added_k is not None:
                context_key = attn.norm_added_k(context_key)
            query = torch.cat([query, context_query], dim=1)
            key = torch.cat([key, context_key], dim=1)
            value = torch.cat([value, context_value], dim=1)
        out = processor_attention(self, query, key, value)
        out = out.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return out, None
        image, context = out.split_with_sizes([hidden_states.shape[1], encoder_hidden_states.shape[1]], dim=1)
        return image.contiguous(), context.contiguous()


def _attn_problem(attn: nn.Module) -> str | None:
    from diffusers.models.attention_processor import JointAttnProcessor2_0

    if type(attn.processor) is not JointAttnProcessor2_0:
        return f"its processor is {type(attn.processor).__name__} (its attention stays its own)"
    return None


def _block_forward(self: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                   temb: torch.Tensor, joint_attention_kwargs=None):
    joint_attention_kwargs = joint_attention_kwargs or {}
    attn = self.attn
    ours = (not joint_attention_kwargs and isinstance(attn.processor, SD3KernelsJointAttnProcessor)
            and runs_unhooked(attn))
    if self.use_dual_attention:
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm_hidden_states2, gate_msa2 = self.norm1(
            hidden_states, emb=temb
        )
    else:  # under FP8 each stream's norm writes its output quantized for its q/k/v projections
        quantized = ours and _fp8.attention_takes_quantized(attn, SD3KernelsJointAttnProcessor)
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = adaln_zero(self.norm1, hidden_states, temb,
                                                                                  quantized)
    if self.context_pre_only:
        norm_encoder_hidden_states = self.norm1_context(encoder_hidden_states, temb)
    else:
        norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = adaln_zero(
            self.norm1_context, encoder_hidden_states, temb, ours and _fp8.context_takes_quantized(attn))
    if ours:
        # Our processor called for the heads: under FP8 each output projection's GEMM writes its
        # stream's gated residual (_fp8.projected_residual).
        attn_output, context_attn_output = attn.processor.attention(attn, norm_hidden_states,
                                                                    norm_encoder_hidden_states)
        hidden_states = _fp8.projected_residual(attn.to_out[0], attn_output, hidden_states, gate_msa[:, None],
                                                attn.to_out[1])
    else:
        attn_output, context_attn_output = attn(
            hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states,
            **joint_attention_kwargs
        )
        hidden_states = ops.gated_residual(hidden_states, attn_output, gate_msa[:, None])
    if self.use_dual_attention:
        attn_output2 = self.attn2(hidden_states=norm_hidden_states2, **joint_attention_kwargs)
        hidden_states = ops.gated_residual(hidden_states, attn_output2, gate_msa2[:, None])
    hidden_states = feed_forward_update(hidden_states, self.norm2, self.ff, shift_mlp, scale_mlp, gate_mlp)
    if self.context_pre_only:
        return None, hidden_states
    if ours:
        encoder_hidden_states = _fp8.projected_residual(attn.to_add_out, context_attn_output, encoder_hidden_states,
                                                        c_gate_msa[:, None])
    else:
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
    """Patches ``model``'s joint blocks and their attention processors (SD3.5's second attention
    too); the AdaLN norms are patched by class."""
    if any(is_patched(block) for block in model.transformer_blocks):
        return
    patch_blocks(model, "transformer_blocks", _block_forward, _block_problem, BLOCK_KIND, report)
    blocks = model.transformer_blocks
    patch_processors(model, blocks, "attn", _attn_problem, SD3KernelsJointAttnProcessor, ATTN_KIND, report)
    patch_processors(model, [b for b in blocks if b.use_dual_attention], "attn2", _attn_problem,
                     SD3KernelsJointAttnProcessor, ATTN_KIND, report)


FAMILY = Family("Stable Diffusion 3", _model_classes, patch_model)

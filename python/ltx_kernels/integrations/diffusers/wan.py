"""Wan 2.1 / 2.2 (diffusers' ``WanTransformer3DModel``): its ``WanTransformerBlock``s and their
self-attention's RoPE on our ops.

Per block (stock computes each norm and residual in fp32 and rounds the result to the model's
dtype; so do the ops, in one pass each):

- ``norm1`` (an ``FP32LayerNorm`` without affine) + the ``scale_shift_table`` modulation: one
  ``adaln_layer_norm``; likewise ``norm3`` + its modulation before the feed-forward;
- ``x + attn1 * gate`` and ``x + ffn * gate``: one ``gated_residual`` each;
- ``norm2`` before the cross-attention (``cross_attn_norm``: an affine ``FP32LayerNorm``):
  ``layer_norm``, its weights read in fp32 where diffusers' ``_keep_in_fp32_modules`` keeps
  them so in a 16-bit model (:func:`~ltx_kernels._forwards.layer_norm_forward`);
- attn1's processor (the stock ``WanAttnProcessor`` only): ours, the same steps with the RoPE
  of q and k as one ``apply_rotary_pos_emb`` (interleaved pairs, the model's ``[S, head_dim]``
  tables read as they are: ``WanRotaryPosEmbed``'s, whose pairs share one angle) instead of
  stock's several strided passes for each; tables of another shape get the stock steps.

The modulation (``scale_shift_table + temb``, per sample ``[B, 6, D]`` or per token
``[B, S, 6, D]`` for Wan 2.2 TI2V) is formed in fp32 as stock, then rounded to the
activations' dtype for the ops, which take one dtype (a no-op for an fp32 model; in bf16 the
tests check the output against fp32 is no worse than stock bf16's).

Stays stock: the cross-attention (attn2, with its image-to-video added K/V when present:
its processor is unchanged), ``x + attn2`` (one add either way), the condition embedder and
the model's output norm (``norm_out``, in the model forward). QK RMSNorms (``torch.nn.RMSNorm``
across heads) and the feed-forward's GELU-tanh projection are patched by class, as in any
model. Submodules are called as modules, so hooks, LoRA and FP8 linears apply; a norm with
hooks runs unfused (``call_fused``).

Under ``inject(precision="fp8")``, where the modules involved run unhooked: norm1 and norm3 write
their outputs quantized (``adaln_layer_norm_fp8``) for the self-attention's q/k/v (which share
it) and the FFN, and the self-attention's output projection and the FFN's down projection GEMMs
write the gated residuals (:func:`_fp8.attention_residual`, :func:`_fp8.feed_forward_gated_residual`).
"""

from __future__ import annotations

import torch
from torch import nn

from ltx_kernels import _fp8, ops
from ltx_kernels._diffusers_attention import processor_attention
from ltx_kernels._forwards import layer_norm_forward
from ltx_kernels._patching import ProcessorOverStock, call_fused, is_patched, runs_unhooked
from ltx_kernels.integrations.family import Family

from .flux import patch_blocks, patch_processors

BLOCK_KIND = "WanTransformerBlock (adaln_layer_norm, layer_norm, gated_residual)"
ATTN_KIND = "WanAttention self-attention RoPE (apply_rotary_pos_emb)"


class WanKernelsAttnProcessor(ProcessorOverStock):
    """diffusers' ``WanAttnProcessor`` for a self-attention (no added K/V projections) with q's
    and k's RoPE in one ``apply_rotary_pos_emb``."""

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states=None,
                 attention_mask=None, rotary_emb=None):
        if not _wan_tables(rotary_emb):  # stock's steps
            return self._stock(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        heads = self.attention(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        return attn.to_out[1](attn.to_out[0](heads))

    def attention(self, attn: nn.Module, hidden_states, encoder_hidden_states=None, attention_mask=None,
                  rotary_emb=None) -> torch.Tensor:
        """What ``__call__`` computes before the output projection, with RoPE tables that
        :func:`_wan_tables` takes: the heads' outputs ``[B, S, inner_dim]``. ``hidden_states``
        may come quantized (:class:`_fp8.Quantized`, norm1's output under FP8) where the q/k/v
        projections take it (:func:`_fp8.attention_takes_quantized`)."""
        from diffusers.models.transformers.transformer_wan import _get_qkv_projections

        cos, sin = rotary_emb
        if attn.fused_projections or encoder_hidden_states is not None:
            query, key, value = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        else:  # under FP8, q/k/v share one quantization of their input (_fp8.linears)
            query, key, value = _fp8.attention_projections(attn, hidden_states)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        query, key = ops.apply_rotary_pos_emb(query, key, cos[0, :, 0], sin[0, :, 0], interleaved=True,
                                              unsqueeze_dim=2)
        hidden_states = processor_attention(self, query, key, value, attention_mask,
                                            parallel=encoder_hidden_states is None)
        return hidden_states.flatten(2, 3).type_as(query)


def _wan_tables(rotary_emb) -> bool:
    """Whether ``rotary_emb`` holds tables of WanRotaryPosEmbed's ``[1, S, 1, head_dim]`` shape,
    which our processor's RoPE reads (others, or none, take the stock processor's steps)."""
    cos = rotary_emb[0] if rotary_emb is not None else None
    return cos is not None and cos.dim() == 4 and cos.shape[0] == 1 and cos.shape[2] == 1


def _modulate(norm: nn.Module, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, quantized: bool = False):
    """Stock ``(norm(x.float()) * (1 + scale) + shift).type_as(x)`` (``norm`` an FP32LayerNorm
    without affine; fp32 ``scale`` / ``shift`` per sample ``[B, 1, D]`` or per token) in one pass;
    ``quantized``: as an FP8 GEMM's input, written so by the norm (``adaln_layer_norm_fp8``)."""
    scale, shift = scale.to(x.dtype), shift.to(x.dtype)
    if quantized:
        return call_fused(
            (norm,),
            lambda: _fp8.Quantized(*ops.adaln_layer_norm_fp8(x, scale, shift, None, None, norm.eps), x.dtype),
            lambda: _fp8.Quantized(*ops.quantize_fp8((norm(x.float()) * (1 + scale) + shift).type_as(x)), x.dtype),
        )
    return call_fused(
        (norm,),
        lambda: ops.adaln_layer_norm(x, scale, shift, None, None, norm.eps),
        lambda: (norm(x.float()) * (1 + scale) + shift).type_as(x),
    )


def _cross_attn_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Stock ``norm(x.float()).type_as(x)`` as one ``layer_norm`` pass (fp32 math, x's dtype out)."""
    if type(norm) is nn.Identity:
        return norm(x)
    return call_fused((norm,), lambda: layer_norm_forward(norm, x), lambda: norm(x.float()).type_as(x))


def _block_forward(self: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                   temb: torch.Tensor, rotary_emb=None) -> torch.Tensor:
    if temb.ndim == 4:  # Wan 2.2 TI2V: [B, S, 6, D], per token
        modulation = (self.scale_shift_table.unsqueeze(0) + temb.float()).unbind(2)
    else:  # [B, 6, D], per sample
        modulation = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
    shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = modulation
    dtype = hidden_states.dtype

    # Our processor with tables it reads: under FP8, norm1 writes its output quantized for the q/k/v
    # projections and the output projection's GEMM writes the gated residual.
    ours = (_wan_tables(rotary_emb) and isinstance(self.attn1.processor, WanKernelsAttnProcessor)
            and runs_unhooked(self.attn1))
    quantized = ours and _fp8.attention_takes_quantized(self.attn1, WanKernelsAttnProcessor)
    normed = _modulate(self.norm1, hidden_states, scale_msa, shift_msa, quantized)
    if ours:
        hidden_states = _fp8.attention_residual(self.attn1, WanKernelsAttnProcessor, hidden_states,
                                                gate_msa.to(dtype), normed, None, None, rotary_emb)
    else:
        attn_output = self.attn1(normed, None, None, rotary_emb)
        hidden_states = ops.gated_residual(hidden_states, attn_output.to(dtype), gate_msa.to(dtype))

    attn_output = self.attn2(_cross_attn_norm(self.norm2, hidden_states), encoder_hidden_states, None, None)
    hidden_states = hidden_states + attn_output

    gate = c_gate_msa.to(dtype)
    if _fp8.feed_forward_takes_quantized(self.ffn) and _fp8.fuses_gated_residual(hidden_states, gate):
        # FP8: norm3 writes the FF's input quantized, the down projection GEMM the gated residual
        return _fp8.feed_forward_gated_residual(
            self.ffn, _modulate(self.norm3, hidden_states, c_scale_msa, c_shift_msa, quantized=True), hidden_states,
            gate)
    normed = _modulate(self.norm3, hidden_states, c_scale_msa, c_shift_msa)
    return ops.gated_residual(hidden_states, self.ffn(normed).to(dtype), gate)


def _plain_fp32_layer_norm(norm: nn.Module, affine: bool) -> bool:
    from diffusers.models.normalization import FP32LayerNorm

    return (type(norm) is FP32LayerNorm and len(norm.normalized_shape) == 1
            and (affine or (norm.weight is None and norm.bias is None)))


def _block_problem(block: nn.Module) -> str | None:
    if not (_plain_fp32_layer_norm(block.norm1, False) and _plain_fp32_layer_norm(block.norm3, False)):
        return "norm1 / norm3 are not FP32LayerNorms without affine"
    if not (type(block.norm2) is nn.Identity or _plain_fp32_layer_norm(block.norm2, True)):
        return f"norm2 is {type(block.norm2).__name__}, not an FP32LayerNorm or Identity"
    return None


def _attn_problem(attn: nn.Module) -> str | None:
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    if type(attn.processor) is not WanAttnProcessor:
        return f"its processor is {type(attn.processor).__name__} (RoPE and attention stay its own)"
    if attn.add_k_proj is not None:
        return "it has added K/V projections (image-to-video), which the stock processor handles"
    return None


def _model_classes() -> tuple[type, ...]:
    from diffusers.models.transformers.transformer_wan import WanTransformer3DModel

    return (WanTransformer3DModel,)


def patch_model(model: nn.Module, report, options) -> None:
    """Patches ``model``'s blocks and their self-attention processors (attn1)."""
    if any(is_patched(block) for block in model.blocks):
        return
    blocks = patch_blocks(model, "blocks", _block_forward, _block_problem, BLOCK_KIND, report)
    patch_processors(model, blocks, "attn1", _attn_problem, WanKernelsAttnProcessor, ATTN_KIND, report)


FAMILY = Family("Wan", _model_classes, patch_model)

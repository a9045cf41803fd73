"""LTX-Video (diffusers ``transformer_ltx.py``) with its block computation on ltx_kernels ops.

What changes, per transformer block (the math is DESIGN.md section 3's LTX block):
- ``norm1`` + AdaLN modulation: one ``adaln_rms_norm`` (scale/shift read in place from the
  ``[B, T, 6, D]`` modulation tensor, per batch T = 1 or per token T = S);
- attn1: ``norm_q``/``norm_k`` + LTX RoPE as one ``ltx_qk_norm_rope`` launch with the angles
  computed in the kernel, so the model's ``[B, S, D]`` fp32 cos/sin tables are never built;
- ``x + attn1 * gate_msa``: written by attn1's output projection, ``linear_gated_residual``
  (under FP8 ``fp8_linear_gated_residual``; where the projection is hooked or not a plain
  linear, e.g. a LoRA layer, the module then ``gated_residual``);
- ``x + attn2``: written by attn2's output projection the same way, without a gate, then norm2
  + modulation, ``adaln_rms_norm`` (under FP8 ``adaln_rms_norm_fp8``); where the projection
  cannot write it, ``x + attn2`` fused with norm2 + modulation, ``gated_residual_adaln_rms_norm``;
- the feed-forward's GELU-tanh (through the generic GELU patch), ``x + ff * gate_mlp``: written
  by the down projection (``linear_gated_residual``, under FP8 ``fp8_linear_gated_residual``),
  else ``gated_residual``.
Model level: the rotary module's tables are replaced by :class:`LtxRopePositions` (unless
``inject(..., rope="stock")``, or an attn1 processor is not ours) and the final LayerNorm +
modulation is one ``adaln_layer_norm``. GEMMs and attention (SDPA or diffusers' attention
dispatcher, with the processor's backend) are untouched.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch
from torch import nn

from ltx_kernels import _fp8, ops
from ltx_kernels._diffusers_attention import processor_attention
from ltx_kernels._patching import ProcessorOverStock, Report, attend, call_fused, is_patched, patch, realized
from ltx_kernels.integrations.family import Family, PatchOptions

_BLOCK_KIND = ("LTXVideoTransformerBlock (adaln_rms_norm, linear_gated_residual or gated_residual, "
               "gated_residual_adaln_rms_norm)")
_ATTN_KIND = "LTXAttention self-attention (ltx_qk_norm_rope)"
_CROSS_ATTN_KIND = "LTXAttention cross-attention (rms_norm q/k, mask broadcast over heads)"
_MODEL_KIND = "LTXVideoTransformer3DModel (in-kernel RoPE angles, adaln_layer_norm output)"
_MODEL_ARGS = [
    "self", "hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask",
    "num_frames", "height", "width", "rope_interpolation_scale", "video_coords",
    "attention_kwargs", "return_dict",
]


class LtxRopePositions(NamedTuple):
    """What the patched model passes to its blocks as ``image_rotary_emb`` instead of the
    ``[B, S, D]`` cos/sin tables of ``LTXVideoRotaryPosEmbed``: the token positions, as the
    keyword arguments of :func:`ltx_kernels.ltx_rope_angles` / :func:`ltx_kernels.ltx_qk_norm_rope`
    (grid sizes or ``video_coords``, ``rope_interpolation_scale``, the rotary module's bases,
    patch sizes and theta), which compute its angles in the kernel."""

    kwargs: dict[str, Any]


def rope_positions(
    rope: nn.Module, num_frames, height, width, rope_interpolation_scale, video_coords
) -> LtxRopePositions:
    return LtxRopePositions(dict(
        num_frames=num_frames, height=height, width=width, rope_interpolation_scale=rope_interpolation_scale,
        video_coords=video_coords, theta=float(rope.theta), base_num_frames=rope.base_num_frames,
        base_height=rope.base_height, base_width=rope.base_width, patch_size=rope.patch_size,
        patch_size_t=rope.patch_size_t,
    ))


class LtxKernelsAttnProcessor(ProcessorOverStock):
    """An LTX block's attention: projections, QK-norm (+ RoPE for attn1, one fused launch with
    in-kernel angles), attention, output projection."""

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: LtxRopePositions | tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        hidden_states = self.attention(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        (hidden_states,) = _fp8.linears(hidden_states, (attn.to_out[0],))
        return attn.to_out[1](hidden_states)

    def attention(self, attn: nn.Module, hidden_states, encoder_hidden_states=None, attention_mask=None,
                  image_rotary_emb=None) -> torch.Tensor:
        """What ``__call__`` computes before the output projection: the heads' outputs, ``[B, S,
        inner_dim]`` in the query's dtype (the block writes the projection with its gated
        residual in one FP8 GEMM, :func:`_fp8.out_projection_fuses_residual`)."""
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch_size, sequence_length, _ = context.shape
        if attention_mask is not None and attention_mask.ndim == 3 and attention_mask.shape[1] == 1:
            # The model's [B, 1, T] additive text mask: broadcast over heads and queries as is
            # (the stock processor first repeats it per head).
            attention_mask = attention_mask.unsqueeze(1)
        elif attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])

        query, key, value = _fp8.attention_projections(attn, hidden_states, encoder_hidden_states)
        query, key = call_fused(
            (attn.norm_q, attn.norm_k),
            lambda: _qk_norm_rope(attn, query, key, image_rotary_emb),
            lambda: _rope(attn.norm_q(query), attn.norm_k(key), image_rotary_emb),
        )

        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
        hidden_states = processor_attention(self, query, key, value, attention_mask)
        return hidden_states.flatten(2, 3).to(query.dtype)


def _qk_norm_rope(attn: nn.Module, query: torch.Tensor, key: torch.Tensor, rotary) -> tuple:
    """norm_q / norm_k (read in place) and the RoPE: one launch with positions."""
    eps = attn.norm_q.eps
    if isinstance(rotary, LtxRopePositions):
        return ops.ltx_qk_norm_rope(query, key, attn.norm_q.weight, attn.norm_k.weight, eps, **rotary.kwargs)
    query = ops.rms_norm(query, attn.norm_q.weight, eps)
    key = ops.rms_norm(key, attn.norm_k.weight, attn.norm_k.eps)
    return _rope(query, key, rotary)


def _rope(query: torch.Tensor, key: torch.Tensor, rotary) -> tuple:
    """The RoPE alone: none (cross-attention), in-kernel angles from positions, or diffusers'
    own (cos, sin) tables (``rope="stock"``, a processor that is not ours in some block, or
    the model forward left stock)."""
    if rotary is None:
        return query, key
    if isinstance(rotary, LtxRopePositions):
        return tuple(ops.ltx_rope_angles(x, **rotary.kwargs) for x in (query, key))
    return ops.ltx_rope(query, *rotary), ops.ltx_rope(key, *rotary)


def _block_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    temb: torch.Tensor,
    image_rotary_emb=None,
    encoder_attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    batch_size = hidden_states.size(0)
    num_ada_params = self.scale_shift_table.shape[0]
    # [B, T, 6, D], T = 1 (one timestep per sample) or S (per-token timesteps, image-to-video):
    # the six modulation vectors are read in place as strided views.
    ada_values = self.scale_shift_table[None, None].to(temb.device) + temb.reshape(
        batch_size, temb.size(1), num_ada_params, -1
    )
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = realized(ada_values).unbind(dim=2)

    dtype = hidden_states.dtype
    # Under FP8, a norm whose consumers are all our FP8 linears writes its output quantized
    # (the q/k/v projections of attn1, the FF's up projection): one pass, no dtype copy.
    attn1_quantized = _fp8.attention_takes_quantized(self.attn1, LtxKernelsAttnProcessor)
    if attn1_quantized:
        norm_hidden_states = _norm_fp8(self.norm1, hidden_states, scale_msa, shift_msa)
    else:
        norm_hidden_states = call_fused(
            (self.norm1,),
            lambda: ops.adaln_rms_norm(hidden_states, scale_msa, shift_msa, self.norm1.weight, self.norm1.eps),
            lambda: self.norm1(hidden_states) * (1 + scale_msa) + shift_msa,
        )
    # x + gate * to_out(attention): under FP8 the output projection's GEMM writes the residual.
    hidden_states = _fp8.attention_residual(self.attn1, LtxKernelsAttnProcessor, hidden_states, gate_msa,
                                            norm_hidden_states, None, None, image_rotary_emb)

    cross_attention = (hidden_states, encoder_hidden_states, encoder_attention_mask, None)
    # Under FP8, norm2 writes its output quantized for the FF's up projection.
    quantized_ff = _fp8.feed_forward_takes_quantized(self.ff)
    if quantized_ff and _fp8.attention_fuses_residual(self.attn2, LtxKernelsAttnProcessor, hidden_states, None):
        # The text cross-attention's output projection writes x + its output (its GEMM reads
        # x), so that norm2 reads one row and writes only its FP8 output, where the fused
        # residual + norm below reads two rows and writes two (H100, LTX-2B 161 frames: that
        # one took 119 us a layer, the norm alone 56).
        hidden_states = _fp8.projected_attention_residual(self.attn2, hidden_states, None, *cross_attention)
        x = _norm_fp8(self.norm2, hidden_states, scale_mlp, shift_mlp)
    elif not quantized_ff:
        if _fp8.attention_fuses_residual(self.attn2, LtxKernelsAttnProcessor, hidden_states, None):
            # In the model's dtype too, the output projection's GEMM writes x + attn2 and norm2
            # reads one row (H100, LTX-2B 161 frames: the fused residual + norm below took 93 us a
            # layer, the norm alone 49).
            hidden_states = _fp8.projected_attention_residual(self.attn2, hidden_states, None, *cross_attention)
            norm_hidden_states = call_fused(
                (self.norm2,),
                lambda: ops.adaln_rms_norm(hidden_states, scale_mlp, shift_mlp, self.norm2.weight, self.norm2.eps),
                lambda: self.norm2(hidden_states) * (1 + scale_mlp) + shift_mlp,
            )
        else:
            attn_hidden_states = attend(self.attn2, *cross_attention)
            residual = hidden_states
            hidden_states, norm_hidden_states = call_fused(
                (self.norm2,),
                lambda: ops.gated_residual_adaln_rms_norm(
                    residual, attn_hidden_states, None, scale_mlp, shift_mlp, self.norm2.weight, self.norm2.eps
                ),
                lambda: _residual_and_norm(self.norm2, residual + attn_hidden_states, scale_mlp, shift_mlp),
            )
        # x + ff * gate_mlp: the down projection's GEMM writes it where it can.
        return _fp8.feed_forward_residual(self.ff, norm_hidden_states, hidden_states, gate_mlp)
    else:
        attn_hidden_states = attend(self.attn2, *cross_attention)
        residual = hidden_states
        hidden_states, *quantized = call_fused(
            (self.norm2,),
            lambda: ops.gated_residual_adaln_rms_norm_fp8(
                residual, attn_hidden_states, None, scale_mlp, shift_mlp, self.norm2.weight, self.norm2.eps
            ),
            lambda: _quantized_residual_and_norm(self.norm2, residual + attn_hidden_states, scale_mlp, shift_mlp),
        )
        x = _fp8.Quantized(*quantized, dtype)
    if _fp8.fuses_gated_residual(hidden_states, gate_mlp):
        return _fp8.feed_forward_gated_residual(self.ff, x, hidden_states, gate_mlp)
    return ops.gated_residual(hidden_states, _fp8.feed_forward_quantized(self.ff, x), gate_mlp)


def _norm_fp8(norm: nn.Module, hidden_states: torch.Tensor, scale, shift) -> _fp8.Quantized:
    """``norm(x) * (1 + scale) + shift`` written quantized for our FP8 linears: one
    ``adaln_rms_norm_fp8`` between the norm's hooks, or the norm module, then ``quantize_fp8``."""
    return _fp8.Quantized(*call_fused(
        (norm,),
        lambda: ops.adaln_rms_norm_fp8(hidden_states, scale, shift, norm.weight, norm.eps),
        lambda: ops.quantize_fp8(norm(hidden_states) * (1 + scale) + shift),
    ), hidden_states.dtype)


def _residual_and_norm(norm: nn.Module, hidden_states, scale, shift) -> tuple:
    """What ``gated_residual_adaln_rms_norm`` fuses, with the norm called as a module."""
    return hidden_states, norm(hidden_states) * (1 + scale) + shift


def _quantized_residual_and_norm(norm: nn.Module, hidden_states, scale, shift) -> tuple:
    """What ``gated_residual_adaln_rms_norm_fp8`` fuses, with the norm called as a module."""
    return hidden_states, *ops.quantize_fp8(norm(hidden_states) * (1 + scale) + shift)


def _model_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    timestep: torch.Tensor,
    encoder_attention_mask: torch.Tensor | None,
    num_frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    rope_interpolation_scale=None,
    video_coords: torch.Tensor | None = None,
    attention_kwargs: dict[str, Any] | None = None,
    return_dict: bool = True,
):
    """``LTXVideoTransformer3DModel.forward`` with positions instead of RoPE tables and a
    fused output norm; everything else as diffusers computes it.

    Positions only reach the blocks when ``inject`` was asked for exact angles, every block's
    attn1 runs our processor (one the user set after ``inject``, e.g. with
    ``set_attn_processor``, takes diffusers' tables) and context parallelism is off (enabled
    after ``inject``, it splits the tokens and the tables, which its hooks on ``rope`` shard;
    the positions would cover every token); otherwise the tables are built as stock.
    """
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    if (self._ltx_kernels_exact_rope and getattr(self, "_parallel_config", None) is None and all(
        isinstance(block.attn1.processor, LtxKernelsAttnProcessor) for block in self.transformer_blocks
    )):
        image_rotary_emb = rope_positions(
            self.rope, num_frames, height, width, rope_interpolation_scale, video_coords
        )
    else:
        image_rotary_emb = self.rope(hidden_states, num_frames, height, width, rope_interpolation_scale, video_coords)
    if encoder_attention_mask is not None and encoder_attention_mask.ndim == 2:
        encoder_attention_mask = (1 - encoder_attention_mask.to(hidden_states.dtype)) * -10000.0
        encoder_attention_mask = encoder_attention_mask.unsqueeze(1)

    batch_size = hidden_states.size(0)
    hidden_states = self.proj_in(hidden_states)
    temb, embedded_timestep = self.time_embed(
        timestep.flatten(), batch_size=batch_size, hidden_dtype=hidden_states.dtype
    )
    temb = temb.view(batch_size, -1, temb.size(-1))
    embedded_timestep = embedded_timestep.view(batch_size, -1, embedded_timestep.size(-1))
    encoder_hidden_states = self.caption_projection(encoder_hidden_states)
    encoder_hidden_states = encoder_hidden_states.view(batch_size, -1, hidden_states.size(-1))

    for block in self.transformer_blocks:
        if torch.is_grad_enabled() and self.gradient_checkpointing:
            hidden_states = self._gradient_checkpointing_func(
                block, hidden_states, encoder_hidden_states, temb, image_rotary_emb, encoder_attention_mask
            )
        else:  # by keyword, as stock: block hooks (caches) may look arguments up by name
            hidden_states = block(
                hidden_states=hidden_states,
                encoder_hidden_states=encoder_hidden_states,
                temb=temb,
                image_rotary_emb=image_rotary_emb,
                encoder_attention_mask=encoder_attention_mask,
            )

    scale_shift_values = self.scale_shift_table[None, None] + embedded_timestep[:, :, None]
    shift, scale = scale_shift_values[:, :, 0], scale_shift_values[:, :, 1]
    hidden_states = ops.adaln_layer_norm(hidden_states, scale, shift, None, None, self.norm_out.eps)
    output = self.proj_out(hidden_states)
    if not return_dict:
        return (output,)
    return Transformer2DModelOutput(sample=output)


def _with_lora_scale(forward):
    """Wraps like the stock forward: diffusers' ``apply_lora_scale`` handles
    ``attention_kwargs["scale"]`` for PEFT LoRA adapters."""
    try:
        from diffusers.utils import apply_lora_scale
    except ImportError:  # older diffusers scale LoRA inside the forward; nothing to wrap
        return forward
    return apply_lora_scale("attention_kwargs")(forward)


_model_forward_with_lora = _with_lora_scale(_model_forward)


def _block_problem(block: nn.Module) -> str | None:
    from diffusers.models.normalization import RMSNorm

    for name in ("norm1", "norm2"):
        norm = getattr(block, name, None)
        if not isinstance(norm, RMSNorm) or getattr(norm, "bias", None) is not None:
            return f"{name} is not a diffusers RMSNorm without bias"
    if block.scale_shift_table.shape[0] != 6:
        return f"scale_shift_table has {block.scale_shift_table.shape[0]} rows, expected 6"
    return _attn_problem(block.attn1, "attn1") or _attn_problem(block.attn2, "attn2")


def _attn_problem(attn: nn.Module, name: str) -> str | None:
    from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor

    if type(attn.processor) is not LTXVideoAttnProcessor:
        return f"{name} uses the custom processor {type(attn.processor).__name__}"
    for norm_name in ("norm_q", "norm_k"):
        norm = getattr(attn, norm_name)
        if not isinstance(norm, nn.RMSNorm) or len(norm.normalized_shape) != 1 or norm.eps is None:
            return f"{name}.{norm_name} is not a torch.nn.RMSNorm over the last dim with an eps"
    if attn.norm_q.eps != attn.norm_k.eps:
        return f"{name}.norm_q and norm_k have different eps"
    if attn.inner_dim != attn.inner_kv_dim:
        return f"{name} has {attn.inner_dim} query and {attn.inner_kv_dim} key channels"
    return None


def fused_submodules(model: nn.Module) -> list[nn.Module]:
    """The norms whose forward a patched block computes inside its fused ops (not called)."""
    return [
        norm
        for block in model.transformer_blocks
        if is_patched(block)
        for norm in (block.norm1, block.norm2, block.attn1.norm_q, block.attn1.norm_k,
                     block.attn2.norm_q, block.attn2.norm_k)
    ]


def projection_groups(model: nn.Module) -> list[tuple[nn.Module, ...]]:
    """Each patched block's self-attention q/k/v (``ltx_qk_norm_rope`` and the attention read
    them as strided rows of one GEMM's output) and its cross-attention's k/v (of the text)."""
    return [
        group
        for block in model.transformer_blocks
        if is_patched(block)
        for group in ((block.attn1.to_q, block.attn1.to_k, block.attn1.to_v), (block.attn2.to_k, block.attn2.to_v))
    ]


def _model_classes() -> tuple[type, ...]:
    from diffusers.models.transformers.transformer_ltx import LTXVideoTransformer3DModel

    return (LTXVideoTransformer3DModel,)


def patch_model(model: nn.Module, report: Report, options: PatchOptions) -> None:
    """Patches one ``LTXVideoTransformer3DModel``: its blocks, their self-attention and the
    model forward (RoPE angles in the kernel if ``options.rope == "exact"``, else diffusers'
    tables). A block whose structure differs from diffusers' is left stock, with a warning in
    the report; so is the model forward if its signature changed."""
    if any(is_patched(block) for block in model.transformer_blocks):
        return
    exact_rope = options.rope == "exact"
    blocks = list(model.transformer_blocks)
    problems = [_block_problem(block) for block in blocks]
    for index, (block, problem) in enumerate(zip(blocks, problems)):
        if problem is not None:
            report.skipped.append(f"transformer_blocks.{index}: {problem}")
            continue
        for attn, kind in ((block.attn1, _ATTN_KIND), (block.attn2, _CROSS_ATTN_KIND)):
            patch(attn, processor=LtxKernelsAttnProcessor(attn.processor))
            report.patched[kind] += 1
        patch(block, _block_forward)
        report.patched[_BLOCK_KIND] += 1

    name = type(model).__name__
    signature = list(inspect.signature(type(model).forward).parameters)
    if signature != _MODEL_ARGS:
        why = f"its signature {signature} differs from the diffusers version ltx_kernels knows"
    elif getattr(model, "_parallel_config", None) is not None:
        why = "context parallelism splits the RoPE tables that the in-kernel angles replace"
    elif any(problems):
        why = "some blocks stay stock and need the RoPE tables"
    else:
        patch(model, _model_forward_with_lora, _ltx_kernels_exact_rope=exact_rope)
        report.patched[_MODEL_KIND] += 1
        return
    report.skipped.append(f"{name}.forward: {why}; RoPE tables and the output norm stay stock")


FAMILY = Family("LTX-Video", _model_classes, patch_model, fused_submodules, projection_groups)

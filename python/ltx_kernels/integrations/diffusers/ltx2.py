"""LTX-2 (diffusers' ``LTX2VideoTransformer3DModel``): its audio-video blocks and attention.

Each ``LTX2VideoTransformerBlock`` runs, for the video and the audio stream, every
``norm(x) * (1 + scale) + shift`` as one ``adaln_rms_norm`` and every ``x + gate * branch`` as
one ``gated_residual`` (stock: a norm, then two multiplies and an add over the activations,
each a pass of its own). The prompt-side modulation of the text keys, over a few hundred tokens,
stays torch. Each ``LTX2Attention`` with the default interleaved RoPE takes our processor: the
projections, ``norm_q`` / ``norm_k`` as ``rms_norm``, the RoPE as ``ltx_rope`` on diffusers'
own (cos, sin) tables (stock upcasts q and k to fp32 and multiplies and adds them there) and
attention through diffusers' dispatcher, as stock. Blocks with perturbed attention (STG) and
attention with the split RoPE stay stock (reported).

Under ``inject(rope="exact")`` (the default) the video self-attention takes its q/k norms and
RoPE as one ``ltx_qk_norm_rope`` launch that computes the angles from the token positions (the
patches' midpoints over the rotary module's bases: LTX-Video's RoPE), instead of two norms and
two launches reading the ``[B, S, D]`` fp32 tables: the video rotary module returns its tables
as stock with the positions beside them (:class:`VideoRopeTables`). Whoever else receives them
(a processor that is not ours, a stock block, context parallelism's sharding hook, which
returns plain tuples) sees the stock tables.
"""

from __future__ import annotations

import torch
from torch import nn

from ltx_kernels import _fp8, ops
from ltx_kernels._diffusers_attention import processor_attention
from ltx_kernels._patching import ProcessorOverStock, call_fused, is_patched, patch
from ltx_kernels.integrations.family import Family

from .flux import patch_blocks, patch_processors
from .ltx_video import LtxRopePositions

BLOCK_KIND = "LTX2VideoTransformerBlock (adaln_rms_norm, gated_residual)"
ATTN_KIND = "LTX2Attention, interleaved RoPE (rms_norm, ltx_rope)"
ROPE_KIND = "LTX2AudioVideoRotaryPosEmbed, video: positions for the q/k kernel (ltx_qk_norm_rope)"


def _eps(norm: nn.Module, x: torch.Tensor) -> float:
    """A norm's eps; torch.nn.RMSNorm's None means the dtype's machine epsilon."""
    return norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps


class VideoRopeTables(tuple):
    """The video rotary module's ``(cos, sin)``, as stock computes them, and ``positions``
    (:class:`LtxRopePositions`: the patches' midpoints ``[B, 3, S]`` over the module's bases),
    from which ``ltx_qk_norm_rope`` computes the same rotation in the kernel, in fp64. A hook
    that rebuilds the tuple (group offloading's device transfer: ``type(t)(...)``) leaves
    ``positions`` None, and the tables are used."""

    positions: LtxRopePositions | None = None


def _video_rope_forward(self: nn.Module, coords: torch.Tensor, device=None):
    """Stock ``LTX2AudioVideoRotaryPosEmbed.forward`` (video, interleaved), its tables returned
    with the positions they come from."""
    tables = VideoRopeTables(type(self).forward(self, coords, device))
    if coords.ndim == 4:  # patch boundaries [start, end): the midpoint, as stock forms it
        coords = (coords[..., 0] + coords[..., 1]) / 2.0
    tables.positions = LtxRopePositions(dict(
        num_frames=None, height=None, width=None, video_coords=coords.to(device or coords.device),
        theta=float(self.theta), base_num_frames=self.base_num_frames, base_height=self.base_height,
        base_width=self.base_width,
    ))
    return tables


def _rope_positions(attn: nn.Module, query: torch.Tensor, key: torch.Tensor, query_rotary_emb,
                    key_rotary_emb) -> LtxRopePositions | None:
    """The positions of a self-attention's RoPE when ``ltx_qk_norm_rope`` can take them: the
    video module's tables came with positions for every token of ``query`` (context
    parallelism's shards come as plain tables), one RoPE for q and k, norms with one eps."""
    if getattr(query_rotary_emb, "positions", None) is None or key_rotary_emb is not None:
        return None
    coords = query_rotary_emb.positions.kwargs["video_coords"]
    if (key.shape != query.shape or coords.shape[0] != query.shape[0] or coords.shape[-1] != query.shape[1]
            or query_rotary_emb[0].shape[-1] != query.shape[-1]
            or _eps(attn.norm_q, query) != _eps(attn.norm_k, key)):
        return None
    return query_rotary_emb.positions


def _qk_norm_rope(attn: nn.Module, query: torch.Tensor, key: torch.Tensor, query_rotary_emb, key_rotary_emb):
    """norm_q / norm_k and the RoPE: one ``ltx_qk_norm_rope`` launch where the positions came
    (:func:`_rope_positions`), else two ``rms_norm`` and two table-reading ``ltx_rope``; with the
    norms called as modules where hooks must see them (the angles from the positions still)."""
    positions = _rope_positions(attn, query, key, query_rotary_emb, key_rotary_emb)
    if positions is not None:
        return call_fused(
            (attn.norm_q, attn.norm_k),
            lambda: ops.ltx_qk_norm_rope(query, key, attn.norm_q.weight, attn.norm_k.weight,
                                         _eps(attn.norm_q, query), **positions.kwargs),
            lambda: tuple(ops.ltx_rope_angles(norm(x), **positions.kwargs)
                          for norm, x in ((attn.norm_q, query), (attn.norm_k, key))),
        )
    query, key = call_fused(
        (attn.norm_q, attn.norm_k),
        lambda: (ops.rms_norm(query, attn.norm_q.weight, _eps(attn.norm_q, query)),
                 ops.rms_norm(key, attn.norm_k.weight, _eps(attn.norm_k, key))),
        lambda: (attn.norm_q(query), attn.norm_k(key)),
    )
    if query_rotary_emb is not None:
        query = ops.ltx_rope(query, *query_rotary_emb)
        key = ops.ltx_rope(key, *(query_rotary_emb if key_rotary_emb is None else key_rotary_emb))
    return query, key


class LTX2KernelsAttnProcessor(ProcessorOverStock):
    """diffusers' ``LTX2AudioVideoAttnProcessor`` (interleaved RoPE) with the q/k norms and the
    RoPE on our ops."""

    def __call__(self, attn: nn.Module, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 query_rotary_emb=None, key_rotary_emb=None) -> torch.Tensor:
        out = self.attention(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                             key_rotary_emb)
        (out,) = _fp8.linears(out, (attn.to_out[0],))
        return attn.to_out[1](out)

    def attention(self, attn: nn.Module, hidden_states, encoder_hidden_states=None, attention_mask=None,
                  query_rotary_emb=None, key_rotary_emb=None) -> torch.Tensor:
        """What ``__call__`` computes before the output projection: the heads' outputs, gated
        (LTX-2.3), ``[B, S, inner_dim]``. ``hidden_states`` and ``encoder_hidden_states`` may
        come quantized (:class:`_fp8.Quantized`, written by a norm) where
        :func:`_fp8.attention_takes_quantized`."""
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch, length, _ = context.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, length, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        query, key, value = _fp8.attention_projections(attn, hidden_states, encoder_hidden_states)
        query, key = _qk_norm_rope(attn, query, key, query_rotary_emb, key_rotary_emb)
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        out = processor_attention(self, query, key, value, attention_mask)
        out = out.flatten(2, 3).to(query.dtype)
        if attn.to_gate_logits is not None:  # per-head gates, 2 * sigmoid (1 at zero logits)
            gates = 2.0 * torch.sigmoid(attn.to_gate_logits(hidden_states))
            out = (out.unflatten(2, (attn.heads, -1)) * gates.unsqueeze(-1)).flatten(2, 3)
        return out


def _modulate(norm: nn.Module, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
              quantized: bool = False):
    """``norm(x) * (1 + scale) + shift`` (scale, shift: [B, 1, D] or per token) in one pass;
    ``quantized``: written in FP8 (:class:`_fp8.Quantized`) for FP8 linears to read, without the
    dtype output."""
    if quantized:
        return call_fused(
            (norm,),
            lambda: _fp8.Quantized(*ops.adaln_rms_norm_fp8(x, scale, shift, norm.weight, _eps(norm, x)), x.dtype),
            lambda: _fp8.Quantized(*ops.quantize_fp8(norm(x) * (1 + scale) + shift), x.dtype),
        )
    return call_fused(
        (norm,),
        lambda: ops.adaln_rms_norm(x, scale, shift, norm.weight, _eps(norm, x)),
        lambda: norm(x) * (1 + scale) + shift,
    )


def _attention_residual(attn: nn.Module, x: torch.Tensor, gate: torch.Tensor | None, **inputs) -> torch.Tensor:
    """``x + gate * attn(**inputs)`` (no gate: ``x + attn(...)``, as stock), the FP8 output
    projection writing the sum where it can (:func:`_fp8.attention_residual`)."""
    return _fp8.attention_residual(attn, LTX2KernelsAttnProcessor, x, gate, **inputs)


def _self_attention(norm: nn.Module, attn: nn.Module, x: torch.Tensor, scale, shift, gate, rope, mask):
    """One stream's ``x + gate * attn(norm(x) * (1 + scale) + shift)``. Under FP8 the norm writes
    its output quantized for the q/k/v projections, and the output projection's GEMM writes the
    gated residual (:func:`_fp8.attention_residual`)."""
    quantized = _fp8.attention_takes_quantized(attn, LTX2KernelsAttnProcessor)
    return _attention_residual(attn, x, gate, hidden_states=_modulate(norm, x, scale, shift, quantized),
                               encoder_hidden_states=None, query_rotary_emb=rope, attention_mask=mask)


def _feed_forward(norm: nn.Module, ff: nn.Module, x: torch.Tensor, scale, shift, gate) -> torch.Tensor:
    """One stream's ``x + gate * ff(norm(x) * (1 + scale) + shift)``; under FP8 the norm writes
    its output quantized and the down projection's GEMM the gated residual, where they can."""
    if not _fp8.feed_forward_takes_quantized(ff):
        return ops.gated_residual(x, ff(_modulate(norm, x, scale, shift)), gate)
    normed = _modulate(norm, x, scale, shift, quantized=True)
    if _fp8.fuses_gated_residual(x, gate):
        return _fp8.feed_forward_gated_residual(ff, normed, x, gate)
    return ops.gated_residual(x, _fp8.feed_forward_quantized(ff, normed), gate)


def _text_attention(norm: nn.Module, attn: nn.Module, x: torch.Tensor, text: torch.Tensor, mask, params,
                    modulated: bool) -> torch.Tensor:
    """One stream's cross-attention to the text, ``x + gate * attn(norm(x)...)``: the query
    modulated and the output gated by ``params[6:9]`` (shift, scale, gate) where LTX-2.3's
    ``cross_attn_mod`` is on, plain otherwise (no gate)."""
    quantized = _fp8.attention_takes_quantized(attn, LTX2KernelsAttnProcessor)
    if modulated:
        shift, scale, gate = params[6:9]
        query = _modulate(norm, x, scale, shift, quantized)
    else:
        query, gate = norm(x), None
    return _attention_residual(attn, x, gate, hidden_states=query, encoder_hidden_states=text,
                               query_rotary_emb=None, attention_mask=mask)


def _cross_modal_attention(attn: nn.Module, x: torch.Tensor, gate: torch.Tensor, query_side: tuple,
                           key_side: tuple, query_rope, key_rope, mask) -> torch.Tensor:
    """``x + gate * attn(...)``, audio-to-video or video-to-audio attention: each side ``(norm,
    stream, scale, shift)`` is ``norm(stream)`` modulated by its own (squeezed, as stock) scale
    and shift; the queries come from one stream (``x``'s), the keys and values from the other,
    each with its RoPE."""
    quantized = _fp8.attention_takes_quantized(attn, LTX2KernelsAttnProcessor)

    def side(norm, stream, scale, shift):
        return _modulate(norm, stream, scale.squeeze(2), shift.squeeze(2), quantized)

    return _attention_residual(attn, x, gate, hidden_states=side(*query_side),
                               encoder_hidden_states=side(*key_side), query_rotary_emb=query_rope,
                               key_rotary_emb=key_rope, attention_mask=mask)


def _block_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    audio_hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    audio_encoder_hidden_states: torch.Tensor,
    temb: torch.Tensor,
    temb_audio: torch.Tensor,
    temb_ca_scale_shift: torch.Tensor,
    temb_ca_audio_scale_shift: torch.Tensor,
    temb_ca_gate: torch.Tensor,
    temb_ca_audio_gate: torch.Tensor,
    temb_prompt: torch.Tensor | None = None,
    temb_prompt_audio: torch.Tensor | None = None,
    video_rotary_emb=None,
    audio_rotary_emb=None,
    ca_video_rotary_emb=None,
    ca_audio_rotary_emb=None,
    encoder_attention_mask: torch.Tensor | None = None,
    audio_encoder_attention_mask: torch.Tensor | None = None,
    self_attention_mask: torch.Tensor | None = None,
    audio_self_attention_mask: torch.Tensor | None = None,
    a2v_cross_attention_mask: torch.Tensor | None = None,
    v2a_cross_attention_mask: torch.Tensor | None = None,
    use_a2v_cross_attention: bool = True,
    use_v2a_cross_attention: bool = True,
    perturbation_mask: torch.Tensor | None = None,
    all_perturbed: bool | None = None,
):
    """Stock ``LTX2VideoTransformerBlock.forward`` (no perturbed attention) on our ops."""
    batch = hidden_states.size(0)
    mod = self.get_mod_params
    video = mod(self.scale_shift_table, temb, batch)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = video[:6]
    audio = mod(self.audio_scale_shift_table, temb_audio, batch)
    a_shift_msa, a_scale_msa, a_gate_msa, a_shift_mlp, a_scale_mlp, a_gate_mlp = audio[:6]

    # 1. self-attention of each stream
    hidden_states = _self_attention(self.norm1, self.attn1, hidden_states, scale_msa, shift_msa, gate_msa,
                                    video_rotary_emb, self_attention_mask)
    audio_hidden_states = _self_attention(self.audio_norm1, self.audio_attn1, audio_hidden_states, a_scale_msa,
                                          a_shift_msa, a_gate_msa, audio_rotary_emb, audio_self_attention_mask)

    # 2. cross-attention to the text (prompt-side modulation of the keys in torch: short rows)
    if self.cross_attn_adaln:
        if temb_prompt is not None:
            shift_kv, scale_kv = mod(self.prompt_scale_shift_table, temb_prompt, batch)
        else:
            shift_kv, scale_kv = self.prompt_scale_shift_table[None, None].to(
                device=hidden_states.device, dtype=hidden_states.dtype).unbind(dim=2)
        if temb_prompt_audio is not None:
            a_shift_kv, a_scale_kv = mod(self.audio_prompt_scale_shift_table, temb_prompt_audio, batch)
        else:
            a_shift_kv, a_scale_kv = self.audio_prompt_scale_shift_table[None, None].to(
                device=audio_hidden_states.device, dtype=audio_hidden_states.dtype).unbind(dim=2)
        encoder_hidden_states = encoder_hidden_states * (1 + scale_kv) + shift_kv
        audio_encoder_hidden_states = audio_encoder_hidden_states * (1 + a_scale_kv) + a_shift_kv
    hidden_states = _text_attention(self.norm2, self.attn2, hidden_states, encoder_hidden_states,
                                    encoder_attention_mask, video, self.video_cross_attn_adaln)
    audio_hidden_states = _text_attention(self.audio_norm2, self.audio_attn2, audio_hidden_states,
                                          audio_encoder_hidden_states, audio_encoder_attention_mask, audio,
                                          self.audio_cross_attn_adaln)

    # 3. audio-to-video and video-to-audio cross-attention: each side's norm modulated twice
    if use_a2v_cross_attention or use_v2a_cross_attention:
        v_table, a_table = self.video_a2v_cross_attn_scale_shift_table, self.audio_a2v_cross_attn_scale_shift_table
        v_a2v_scale, v_a2v_shift, v_v2a_scale, v_v2a_shift = mod(v_table[:4, :], temb_ca_scale_shift, batch)
        a_a2v_scale, a_a2v_shift, a_v2a_scale, a_v2a_shift = mod(a_table[:4, :], temb_ca_audio_scale_shift, batch)
        a2v_gate = mod(v_table[4:, :], temb_ca_gate, batch)[0].squeeze(2)
        v2a_gate = mod(a_table[4:, :], temb_ca_audio_gate, batch)[0].squeeze(2)
        video_norm, audio_norm = self.audio_to_video_norm, self.video_to_audio_norm
        if use_a2v_cross_attention:
            new_hidden_states = _cross_modal_attention(
                self.audio_to_video_attn, hidden_states, a2v_gate,
                (video_norm, hidden_states, v_a2v_scale, v_a2v_shift),
                (audio_norm, audio_hidden_states, a_a2v_scale, a_a2v_shift),
                ca_video_rotary_emb, ca_audio_rotary_emb, a2v_cross_attention_mask)
        if use_v2a_cross_attention:  # reads the video stream from before the a2v update, as stock
            audio_hidden_states = _cross_modal_attention(
                self.video_to_audio_attn, audio_hidden_states, v2a_gate,
                (audio_norm, audio_hidden_states, a_v2a_scale, a_v2a_shift),
                (video_norm, hidden_states, v_v2a_scale, v_v2a_shift),
                ca_audio_rotary_emb, ca_video_rotary_emb, v2a_cross_attention_mask)
        if use_a2v_cross_attention:
            hidden_states = new_hidden_states

    # 4. feed-forward of each stream
    hidden_states = _feed_forward(self.norm3, self.ff, hidden_states, scale_mlp, shift_mlp, gate_mlp)
    audio_hidden_states = _feed_forward(self.audio_norm3, self.audio_ff, audio_hidden_states, a_scale_mlp,
                                        a_shift_mlp, a_gate_mlp)
    return hidden_states, audio_hidden_states


def _block_problem(block: nn.Module) -> str | None:
    if block.perturbed_attn:
        return "perturbed attention (STG) is on"
    return None


def _attn_problem(attn: nn.Module) -> str | None:
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoAttnProcessor

    if type(attn.processor) is not LTX2AudioVideoAttnProcessor:
        return f"its processor is {type(attn.processor).__name__} (its attention stays its own)"
    if attn.rope_type != "interleaved":
        return f"its RoPE is {attn.rope_type!r} (per-head tables; stays stock)"
    return None


_ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")


def _model_classes() -> tuple[type, ...]:
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformer3DModel

    return (LTX2VideoTransformer3DModel,)


def patch_model(model: nn.Module, report, options) -> None:
    """Patches ``model``'s blocks and the processors of their six attentions (norms and the
    feed-forwards' GELU are patched by class), and under ``options.rope == "exact"`` the video
    rotary module (its tables come with their positions)."""
    if any(is_patched(block) for block in model.transformer_blocks):
        return
    patch_blocks(model, "transformer_blocks", _block_forward, _block_problem, BLOCK_KIND, report)
    for name in _ATTENTIONS:
        patch_processors(model, model.transformer_blocks, name, _attn_problem, LTX2KernelsAttnProcessor, ATTN_KIND,
                         report)
    rope = getattr(model, "rope", None)
    if (options.rope == "exact" and rope is not None and not is_patched(rope)
            and getattr(rope, "modality", None) == "video" and getattr(rope, "rope_type", None) == "interleaved"):
        patch(rope, _video_rope_forward)
        report.patched[ROPE_KIND] += 1


FAMILY = Family("LTX-2", _model_classes, patch_model)

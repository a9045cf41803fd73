"""FLUX.1 (diffusers' ``FluxTransformer2DModel``) and the AdaLN-Zero norms DiTs share.

- ``AdaLayerNormZero`` / ``AdaLayerNormZeroSingle`` (FLUX, SD3, HunyuanVideo, ...): the
  modulation's linear stays the module's; ``norm(x) * (1 + scale) + shift`` is one
  ``adaln_layer_norm`` pass (a LayerNorm without affine, per-sample scale and shift).
- ``FluxTransformerBlock`` (double stream): each ``x + gate * branch`` is one ``gated_residual``
  pass and norm2 + modulation one ``adaln_layer_norm``, for both streams.
- ``FluxSingleTransformerBlock``: ``proj_mlp`` + GELU-tanh is ``linear_gelu_tanh`` (the GELU in the
  GEMM's epilogue) and ``residual + gate * proj_out(...)`` one ``gated_residual``.

- ``FluxAttention`` with the stock ``FluxAttnProcessor``: our processor, the same steps with the
  RoPE of q and k as one ``apply_rotary_pos_emb`` (interleaved pairs, the model's fp32 tables
  read as they are) instead of two fp32 passes each; attention stays on diffusers' dispatch.

The submodules (linears, attention, feed-forwards) are still called as modules, so hooks,
LoRA and FP8 linears work on them; a norm with hooks runs unfused (``call_fused``).

Under ``inject(precision="fp8")``, where the modules involved run unhooked: the projections
that read one input share its quantization (each stream's q/k/v; a single block's q/k/v and
``proj_mlp``), written by the AdaLN norm before them (``adaln_layer_norm_fp8``, as the
feed-forwards' inputs), and each ``x + gate * linear(...)`` is one FP8 GEMM writing the sum (the output
projections, the feed-forwards' down projections, ``proj_out``: :func:`_fp8.projected_residual`);
a single block's ``proj_out`` runs as two such GEMMs over its input's two parts, the attention's
output and the MLP's (GELU in the latter's quantization, no concatenation:
:func:`_split_out_projection`).
"""

from __future__ import annotations

import torch
from torch import nn

from ltx_kernels import _fp8, ops
from ltx_kernels._diffusers_attention import processor_attention
from ltx_kernels._forwards import linear_gelu_tanh
from ltx_kernels._patching import ProcessorOverStock, call_fused, is_patched, patch, runs_unhooked
from ltx_kernels.integrations.family import Family

ADALN_KIND = "AdaLayerNormZero (adaln_layer_norm)"
ADALN_SINGLE_KIND = "AdaLayerNormZeroSingle (adaln_layer_norm)"
BLOCK_KIND = "FluxTransformerBlock (gated_residual, adaln_layer_norm)"
SINGLE_KIND = "FluxSingleTransformerBlock (linear_gelu_tanh, gated_residual)"
ATTN_KIND = "FluxAttention RoPE (apply_rotary_pos_emb)"


def _projections(attn: nn.Module, hidden_states, encoder_hidden_states=None) -> tuple:
    """diffusers' q, k, v of each stream (``_get_qkv_projections``); under FP8 the projections
    of one input share its quantization (:func:`_fp8.linears`; ``hidden_states`` may come
    quantized, :class:`_fp8.Quantized`). Fused ``to_qkv`` projections stay diffusers'."""
    from diffusers.models.transformers.transformer_flux import _get_qkv_projections

    if attn.fused_projections:
        return _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
    query, key, value = _fp8.attention_projections(attn, hidden_states)
    if encoder_hidden_states is None or attn.added_kv_proj_dim is None:
        return query, key, value, None, None, None
    return query, key, value, *_fp8.linears(encoder_hidden_states, (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))


class FluxKernelsAttnProcessor(ProcessorOverStock):
    """diffusers' FluxAttnProcessor with q's and k's RoPE in one ``apply_rotary_pos_emb``."""

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states=None,
                 attention_mask=None, image_rotary_emb=None):
        out = self.attention(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        if encoder_hidden_states is None:
            return out
        image, text = out
        return attn.to_out[1](attn.to_out[0](image)), attn.to_add_out(text)

    def attention(self, attn: nn.Module, hidden_states, encoder_hidden_states=None, attention_mask=None,
                  image_rotary_emb=None):
        """What ``__call__`` computes before the output projections: the heads' outputs ``[B,
        S, inner_dim]``, for a joint attention (``encoder_hidden_states`` given) ``(image,
        text)``. ``hidden_states`` may come quantized where :func:`_fp8.attention_takes_quantized`
        (the single blocks' shared input)."""
        query, key, value, encoder_query, encoder_key, encoder_value = _projections(
            attn, hidden_states, encoder_hidden_states
        )
        query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
        key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
        value = value.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            query = torch.cat([attn.norm_added_q(encoder_query.unflatten(-1, (-1, attn.head_dim))), query], dim=1)
            key = torch.cat([attn.norm_added_k(encoder_key.unflatten(-1, (-1, attn.head_dim))), key], dim=1)
            value = torch.cat([encoder_value.unflatten(-1, (-1, attn.head_dim)), value], dim=1)
        if image_rotary_emb is not None:
            cos, sin = image_rotary_emb  # [S, head_dim] each, pairs interleaved
            query, key = ops.apply_rotary_pos_emb(query, key, cos, sin, interleaved=True, unsqueeze_dim=2)

        hidden_states = processor_attention(self, query, key, value, attention_mask)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return hidden_states
        text = encoder_hidden_states.shape[1]
        encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
            [text, hidden_states.shape[1] - text], dim=1)
        return hidden_states.contiguous(), encoder_hidden_states.contiguous()


def _attn_problem(attn: nn.Module) -> str | None:
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    if type(attn.processor) is not FluxAttnProcessor:
        return f"its processor is {type(attn.processor).__name__} (RoPE and attention stay its own)"
    return None


def plain_layer_norm(norm: nn.Module) -> bool:
    """Whether ``norm`` is what ``adaln_layer_norm`` computes: a torch LayerNorm over the last
    dim without affine. Shared by the DiT integrations."""
    return type(norm) is nn.LayerNorm and norm.weight is None and norm.bias is None and len(norm.normalized_shape) == 1


def adaln_zero_problem(module: nn.Module) -> str | None:
    """Why an AdaLayerNormZero(Single) cannot take the fused forward, or None."""
    if not plain_layer_norm(module.norm):
        return f"its norm is {type(module.norm).__name__} (the fused op is a LayerNorm without affine)"
    return None


def modulate(norm: nn.Module, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
             quantized: bool = False):
    """``norm(x) * (1 + scale) + shift`` with per-sample [B, D] scale and shift; ``quantized``:
    as an FP8 GEMM's input (:class:`_fp8.Quantized`), written so by the norm
    (``adaln_layer_norm_fp8``) instead of a dtype output that a quantize pass reads again."""
    scale, shift = scale[:, None], shift[:, None]
    if quantized:
        return call_fused(
            (norm,),
            lambda: _fp8.Quantized(*ops.adaln_layer_norm_fp8(x, scale, shift, None, None, norm.eps), x.dtype),
            lambda: _fp8.Quantized(*ops.quantize_fp8(norm(x) * (1 + scale) + shift), x.dtype),
        )
    return call_fused(
        (norm,),
        lambda: ops.adaln_layer_norm(x, scale, shift, None, None, norm.eps),
        lambda: norm(x) * (1 + scale) + shift,
    )


def adaln_zero_forward(self: nn.Module, x: torch.Tensor, timestep=None, class_labels=None, hidden_dtype=None,
                       emb: torch.Tensor | None = None, quantized: bool = False):
    """``AdaLayerNormZero``'s forward (``quantized``: its normed output for FP8 linears, the
    blocks' call where :func:`norm_quantizes`)."""
    if self.emb is not None:
        emb = self.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
    emb = self.linear(self.silu(emb))
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
    return modulate(self.norm, x, scale_msa, shift_msa, quantized), gate_msa, shift_mlp, scale_mlp, gate_mlp


def adaln_zero_single_forward(self: nn.Module, x: torch.Tensor, emb: torch.Tensor | None = None,
                              quantized: bool = False):
    emb = self.linear(self.silu(emb))
    shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
    return modulate(self.norm, x, scale_msa, shift_msa, quantized), gate_msa


def norm_quantizes(norm: nn.Module) -> bool:
    """Whether a block may call ``norm``'s forward (ours, unhooked) for a quantized output.
    Shared by the DiT integrations."""
    return is_patched(norm) and runs_unhooked(norm)


def adaln_zero(norm: nn.Module, x: torch.Tensor, temb: torch.Tensor, quantized: bool):
    """``norm(x, emb=temb)`` for an AdaLayerNormZero; ``quantized``: its normed output written
    for FP8 linears (:class:`_fp8.Quantized`) where the norm's forward may do it
    (:func:`norm_quantizes`). Shared by the joint-attention blocks (FLUX, SD3)."""
    if quantized and norm_quantizes(norm):
        return adaln_zero_forward(norm, x, emb=temb, quantized=True)
    return norm(x, emb=temb)


def _clip_fp16(x: torch.Tensor) -> torch.Tensor:
    return x.clip(-65504, 65504) if x.dtype == torch.float16 else x  # as the stock blocks


def _block_forward(self: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                   temb: torch.Tensor, image_rotary_emb=None, joint_attention_kwargs=None):
    attn = self.attn
    ours = not joint_attention_kwargs and isinstance(attn.processor, FluxKernelsAttnProcessor) and runs_unhooked(attn)
    # Under FP8 each stream's norm writes its output quantized for its q/k/v projections.
    norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = adaln_zero(
        self.norm1, hidden_states, temb, ours and _fp8.attention_takes_quantized(attn, FluxKernelsAttnProcessor))
    norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = adaln_zero(
        self.norm1_context, encoder_hidden_states, temb, ours and _fp8.context_takes_quantized(attn))
    if ours:
        # Our processor called for the heads, so that under FP8 each output projection's GEMM
        # writes its stream's gated residual (_fp8.projected_residual).
        image, text = attn.processor.attention(attn, norm_hidden_states, norm_encoder_hidden_states, None,
                                               image_rotary_emb)
        hidden_states = _fp8.projected_residual(attn.to_out[0], image, hidden_states, gate_msa[:, None],
                                                attn.to_out[1])
        hidden_states = feed_forward_update(hidden_states, self.norm2, self.ff, shift_mlp, scale_mlp, gate_mlp)
        encoder_hidden_states = _fp8.projected_residual(attn.to_add_out, text, encoder_hidden_states,
                                                        c_gate_msa[:, None])
        encoder_hidden_states = feed_forward_update(encoder_hidden_states, self.norm2_context, self.ff_context,
                                                    c_shift_mlp, c_scale_mlp, c_gate_mlp)
        return _clip_fp16(encoder_hidden_states), hidden_states

    attention_outputs = attn(
        hidden_states=norm_hidden_states,
        encoder_hidden_states=norm_encoder_hidden_states,
        image_rotary_emb=image_rotary_emb,
        **(joint_attention_kwargs or {}),
    )
    attn_output, context_attn_output = attention_outputs[:2]

    hidden_states = ops.gated_residual(hidden_states, attn_output, gate_msa[:, None])
    hidden_states = feed_forward_update(hidden_states, self.norm2, self.ff, shift_mlp, scale_mlp, gate_mlp)
    if len(attention_outputs) == 3:  # an IP-adapter's attention output
        hidden_states = hidden_states + attention_outputs[2]

    encoder_hidden_states = ops.gated_residual(encoder_hidden_states, context_attn_output, c_gate_msa[:, None])
    encoder_hidden_states = feed_forward_update(encoder_hidden_states, self.norm2_context, self.ff_context,
                                                c_shift_mlp, c_scale_mlp, c_gate_mlp)
    return _clip_fp16(encoder_hidden_states), hidden_states


def feed_forward_update(x: torch.Tensor, norm: nn.Module, ff, shift, scale, gate) -> torch.Tensor:
    """An AdaLN-Zero stream's feed-forward half, ``x + gate * ff(norm(x) * (1 + scale) + shift)``
    with per-sample [B, D] shift, scale and gate: one norm pass, then the down projection's GEMM
    writes the gated residual (:func:`_fp8.feed_forward_gated_residual` under FP8,
    :func:`_fp8.feed_forward_residual` in the model's dtype, which falls back to the module and
    ``gated_residual``)."""
    gate = gate[:, None]
    if _fp8.feed_forward_takes_quantized(ff) and _fp8.fuses_gated_residual(x, gate):
        return _fp8.feed_forward_gated_residual(ff, modulate(norm, x, scale, shift, quantized=True), x, gate)
    return _fp8.feed_forward_residual(ff, modulate(norm, x, scale, shift), x, gate)


def _single_block_forward(self: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                          temb: torch.Tensor, image_rotary_emb=None, joint_attention_kwargs=None):
    text_seq_len = encoder_hidden_states.shape[1]
    hidden_states = _joined(encoder_hidden_states, hidden_states)
    residual = hidden_states
    if (not joint_attention_kwargs and _fp8.attention_takes_quantized(self.attn, FluxKernelsAttnProcessor)
            and _fp8.take_quantized((self.proj_mlp,))):
        # FP8: q, k, v and proj_mlp read one quantization of the norm's output, which the norm
        # writes where it can.
        if norm_quantizes(self.norm):
            shared, gate = adaln_zero_single_forward(self.norm, hidden_states, emb=temb, quantized=True)
        else:
            norm_hidden_states, gate = self.norm(hidden_states, emb=temb)
            shared = _fp8.Quantized(*ops.quantize_fp8(norm_hidden_states), norm_hidden_states.dtype)
        (mlp_hidden_states,) = _fp8.linears(shared, (self.proj_mlp,))
        attn_output = self.attn.processor.attention(self.attn, shared, None, None, image_rotary_emb)
        if _splits_out_projection(self.proj_out, attn_output, residual, gate[:, None]):
            hidden_states = _split_out_projection(self.proj_out, attn_output, mlp_hidden_states, residual,
                                                  gate[:, None])
            return hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]
        mlp_hidden_states = self.act_mlp(mlp_hidden_states)
    else:
        norm_hidden_states, gate = self.norm(hidden_states, emb=temb)
        # A LoRA-wrapped, FP8 or library-owned projection runs as itself, then act_mlp.
        mlp_hidden_states = linear_gelu_tanh(self.proj_mlp, norm_hidden_states,
                                             lambda: self.act_mlp(self.proj_mlp(norm_hidden_states)),
                                             (self.act_mlp,))
        attn_output = self.attn(hidden_states=norm_hidden_states, image_rotary_emb=image_rotary_emb,
                                **(joint_attention_kwargs or {}))
    hidden_states = torch.cat([attn_output, mlp_hidden_states], dim=2)
    hidden_states = _clip_fp16(_fp8.projected_residual(self.proj_out, hidden_states, residual, gate[:, None]))
    return hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]


def _joined(text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    """``torch.cat([text, image], dim=1)``; where they are the two parts of one ``[B, T + S, D]``
    tensor, as the single block before returns them (views of its output), that tensor, as a
    view: FLUX.1-dev's 37 later single blocks each copied 28 MB back together otherwise. Not
    while tracing (Inductor plans the concatenation) nor where autograd records the call."""
    if (torch.compiler.is_compiling() or (torch.is_grad_enabled() and (text.requires_grad or image.requires_grad))
            or text.dim() != 3 or text.dtype != image.dtype or text.device != image.device
            or text.numel() == 0 or image.numel() == 0):
        return torch.cat([text, image], dim=1)
    (batch, tokens, dim), total = text.shape, text.shape[1] + image.shape[1]
    if (image.shape[0] == batch and image.shape[2] == dim and text.stride() == image.stride()
            and text.stride() == (total * dim, dim, 1)
            and text.untyped_storage().data_ptr() == image.untyped_storage().data_ptr()
            and image.storage_offset() == text.storage_offset() + tokens * dim):
        return text.as_strided((batch, total, dim), text.stride(), text.storage_offset())
    return torch.cat([text, image], dim=1)


def _splits_out_projection(proj_out: nn.Module, attn_output: torch.Tensor, residual: torch.Tensor,
                           gate: torch.Tensor) -> bool:
    """Whether :func:`_split_out_projection` applies: proj_out fuses the gated residual
    (:func:`_fp8.projection_fuses_residual`), the attention's width is a whole number of the FP8
    GEMM's 16-column k steps, and the output is bf16 (an fp16 sum of the first part alone could
    overflow where stock's clipped total does not)."""
    return (residual.dtype == torch.bfloat16 and attn_output.size(-1) % 16 == 0
            and _fp8.projection_fuses_residual(proj_out, residual, gate))


def _split_out_projection(proj_out: nn.Module, attn_output: torch.Tensor, mlp: torch.Tensor,
                          residual: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``residual + gate * proj_out(cat([attn_output, gelu_tanh(mlp)], -1))`` under FP8 as two
    GEMMs over the two column blocks of proj_out's weight (views, its row scales shared), each
    writing the gated residual, the second onto the first's sum. Each part is quantized on its
    own (its own row scales), the GELU inside mlp's quantization: no GELU pass over the MLP's
    output and no concatenation (FLUX.1-dev 1024^2 on an H100: 2.8 + 1.9 ms of the FP8 step).
    The first sum is rounded once more than a single GEMM's, as stock rounds proj_out's output
    before its gate and its residual."""
    dim = attn_output.size(-1)
    weight, weight_scale = proj_out.weight, proj_out.weight_scale
    first = ops.fp8_linear_gated_residual(*ops.quantize_fp8(attn_output), weight[:, :dim], weight_scale,
                                          _fp8.bias_of(proj_out, residual.dtype), residual, gate)
    return ops.fp8_linear_gated_residual(*ops.quantize_fp8(mlp, activation="gelu_tanh"), weight[:, dim:],
                                         weight_scale, None, first, gate)


def _block_problem(block: nn.Module) -> str | None:
    if not (plain_layer_norm(block.norm2) and plain_layer_norm(block.norm2_context)):
        return "norm2 / norm2_context are not LayerNorms without affine"
    return None


def _single_block_problem(block: nn.Module) -> str | None:
    if not (type(block.act_mlp) is nn.GELU and block.act_mlp.approximate == "tanh"):
        return f"act_mlp is {block.act_mlp!r}, not GELU(approximate='tanh')"
    return None


def patch_blocks(model: nn.Module, name: str, forward, problem, kind: str, report) -> list[nn.Module]:
    """Patches each block of ``model.<name>`` with ``forward`` unless ``problem(block)`` says why
    not (then reported); returns the patched blocks. Shared by the DiT integrations."""
    patched = []
    for i, block in enumerate(getattr(model, name)):
        why = problem(block)
        if why is not None:
            report.skipped.append(f"{type(model).__name__}.{name}.{i} stays stock: {why}")
            continue
        patch(block, forward)
        report.patched[kind] += 1
        patched.append(block)
    return patched


def patch_processors(model: nn.Module, blocks, name: str, problem, processor, kind: str, report) -> None:
    """Gives each block's attention ``block.<name>`` our ``processor(stock processor)`` unless
    ``problem(attention)`` says why not (then reported). Shared by the DiT integrations."""
    for block in blocks:
        attn = getattr(block, name)
        why = problem(attn)
        if why is not None:
            report.skipped.append(f"{type(model).__name__}: a {type(block).__name__}'s {name}: {why}")
            continue
        patch(attn, processor=processor(attn.processor))
        report.patched[kind] += 1


def _model_classes() -> tuple[type, ...]:
    from diffusers.models.transformers.transformer_flux import FluxTransformer2DModel

    return (FluxTransformer2DModel,)


def patch_model(model: nn.Module, report, options) -> None:
    """Patches ``model``'s double- and single-stream blocks and their attention processors
    (the AdaLN norms are patched by class, as in any model)."""
    if any(is_patched(block) for block in model.transformer_blocks):
        return
    blocks = (patch_blocks(model, "transformer_blocks", _block_forward, _block_problem, BLOCK_KIND, report)
              + patch_blocks(model, "single_transformer_blocks", _single_block_forward, _single_block_problem,
                             SINGLE_KIND, report))
    patch_processors(model, blocks, "attn", _attn_problem, FluxKernelsAttnProcessor, ATTN_KIND, report)


FAMILY = Family("FLUX", _model_classes, patch_model)

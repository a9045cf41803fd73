"""Falcon (``model_type="falcon"``) beyond its LayerNorms: causal attention without a mask.

Stock ``FalconModel`` always materializes a ``[B, 1, S, S]`` causal mask (so that ALiBi can be
added to it), and SDPA given a mask and fewer key/value heads than query heads (Falcon-7B's
multi-query attention) runs its math backend: at 8192 tokens that is 70% of the prefill. When the
mask is the plain causal one (:func:`~ltx_kernels.integrations.transformers.causal.plain_causal`:
no padding, positions 0..S-1, an empty cache), the patched ``FalconModel``
passes ``attention_mask=None`` to its layers, which in stock's attention means causal, and the
patched ``FalconAttention`` then runs SDPA with ``is_causal`` and ``enable_gqa`` (FlashAttention)
after our ``apply_rotary_pos_emb`` on the projections. Any other mask, ALiBi, or
``output_attentions`` runs stock's forwards unchanged. The decision is made from the call's
arguments once per model call and travels as the layers' ``attention_mask`` argument, so gradient
checkpointing recomputes the same path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ltx_kernels import ops
from ltx_kernels._patching import Report, patch
from ltx_kernels.integrations.transformers.causal import plain_causal

ATTENTION_KIND = "FalconAttention, mask-free causal prefill (apply_rotary_pos_emb, SDPA)"
MODEL_KIND = "FalconModel: causal mask left to SDPA when it is the plain causal mask"


def model_forward(self, input_ids=None, past_key_values=None, attention_mask=None, position_ids=None,
                  inputs_embeds=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                  return_dict=None, **kwargs):
    """Stock ``FalconModel.forward`` (rotary models) with ``attention_mask=None`` for the layers
    when the mask would be the plain causal one; stock's forward otherwise."""
    from transformers.cache_utils import DynamicCache
    from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

    config = self.config
    output_attentions = config.output_attentions if output_attentions is None else output_attentions
    embedded = inputs_embeds if input_ids is None else input_ids
    if (output_attentions or embedded is None or (input_ids is None) == (inputs_embeds is None)
            or not plain_causal(self, embedded.shape[1], attention_mask, position_ids, past_key_values)):
        return type(self).forward(self, input_ids, past_key_values, attention_mask, position_ids, inputs_embeds,
                                  use_cache, output_attentions, output_hidden_states, return_dict, **kwargs)
    output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
    use_cache = (config.use_cache if use_cache is None else use_cache) and not (
        self.gradient_checkpointing and self.training)  # as stock: checkpointing turns the cache off
    return_dict = config.return_dict if return_dict is None else return_dict
    if inputs_embeds is None:
        inputs_embeds = self.word_embeddings(input_ids)
    if use_cache and past_key_values is None:
        past_key_values = DynamicCache(config=config)
    position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device).unsqueeze(0)
    hidden_states = inputs_embeds
    position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
    all_hidden_states = () if output_hidden_states else None
    for block in self.h:
        if output_hidden_states:
            all_hidden_states += (hidden_states,)
        hidden_states = block(hidden_states, layer_past=past_key_values, attention_mask=None,
                              position_ids=position_ids, use_cache=use_cache, output_attentions=False, alibi=None,
                              position_embeddings=position_embeddings)[0]
    hidden_states = self.ln_f(hidden_states)
    if output_hidden_states:
        all_hidden_states += (hidden_states,)
    if not return_dict:
        return tuple(v for v in (hidden_states, past_key_values, all_hidden_states) if v is not None)
    return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, past_key_values=past_key_values,
                                                     hidden_states=all_hidden_states, attentions=None)


def attention_forward(self, hidden_states, alibi, attention_mask, position_ids=None, layer_past=None,
                      use_cache=False, output_attentions=False, position_embeddings=None, **kwargs):
    """Stock ``FalconAttention.forward`` for ``attention_mask=None`` (causal) without ALiBi:
    the rotary embedding on the projections' views, SDPA with grouped heads; stock otherwise."""
    if attention_mask is not None or alibi is not None or output_attentions or position_embeddings is None:
        return type(self).forward(self, hidden_states, alibi, attention_mask, position_ids, layer_past, use_cache,
                                  output_attentions, position_embeddings, **kwargs)
    batch, tokens, _ = hidden_states.shape
    query, key, value = self._split_heads(self.query_key_value(hidden_states))  # [B, S, heads, D]
    cos, sin = position_embeddings
    query, key = ops.apply_rotary_pos_emb(query, key, cos, sin, unsqueeze_dim=2)
    query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if layer_past is not None:
        key, value = layer_past.update(key, value, self.layer_idx)
    out = F.scaled_dot_product_attention(query, key, value, is_causal=tokens > 1,
                                         enable_gqa=key.shape[1] != query.shape[1])
    return self.dense(out.transpose(1, 2).reshape(batch, tokens, -1)), None


def patch_attention(model: nn.Module, report: Report) -> None:
    """Patches every rotary ``FalconModel`` under ``model`` and its attention modules; ALiBi
    models stay stock (said in the report)."""
    from transformers.models.falcon.modeling_falcon import FalconAttention, FalconModel

    for name, module in model.named_modules():
        if type(module) is not FalconModel:
            continue
        if module.use_alibi:
            report.skipped.append(f"{name or type(model).__name__}: ALiBi attention (its mask carries the bias) "
                                  "stays stock")
            continue
        attentions = [m for m in module.modules() if type(m) is FalconAttention]
        patch(module, model_forward)
        report.patched[MODEL_KIND] += 1
        for attention in attentions:
            patch(attention, attention_forward)
        report.patched[ATTENTION_KIND] += len(attentions)

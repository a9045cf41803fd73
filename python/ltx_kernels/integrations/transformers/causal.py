"""When a causal LM's attention mask is exactly SDPA's ``is_causal`` mask.

A call with no padding, positions 0..S-1 and an empty cache needs no materialized mask: SDPA
with ``is_causal`` runs FlashAttention, where a ``[B, 1, S, S]`` mask sends it to the
memory-efficient backend (about 3x slower at Llama-3-8B's 2 x 4096 training batch on an H100)
or, with grouped heads, to the math one. Transformers skips the mask itself in eager mode, after
looking at the values of the padding mask, but under torch.compile it always builds one (a
traced call cannot read values). The decision here is made from the call's arguments alone
when they are None, so it also holds under compile; values are read only where allowed.

Falcon's patched model passes the decision to its layers as ``attention_mask=None``
(integrations.transformers.falcon). The other families' model forwards stay stock and pass
their keyword arguments on to each layer's attention, so :func:`model_forward` adds
``CAUSAL_KWARG=True`` to the call, which the patched attention (ltx_kernels.transformers)
takes out, dropping the mask. A gradient-checkpointed layer recomputes with the same keyword.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ltx_kernels._patching import patch

CAUSAL_KWARG = "ltx_kernels_plain_causal"
MODEL_KIND = "decoder model: causal mask left to SDPA when it is the plain causal mask (also under torch.compile)"


def values_readable(t: torch.Tensor) -> bool:
    """Whether reading ``t``'s values on the host is allowed (not while tracing or capturing)."""
    return not (torch.compiler.is_compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing()))


def plain_causal(model: nn.Module, tokens: int, attention_mask, position_ids, past_key_values) -> bool:
    """Whether the mask ``model`` (a decoder stack) would build for this call is exactly SDPA's
    ``is_causal`` mask: SDPA attention, more than one token, an empty cache, no padding and
    positions 0..S-1 (given as None, or read and checked where values are readable)."""
    config = model.config
    if tokens < 2 or config._attn_implementation != "sdpa" or getattr(config, "use_bidirectional_attention", False):
        return False
    if past_key_values is not None:
        past = past_key_values.get_seq_length()
        if isinstance(past, torch.Tensor):  # static caches count in a tensor
            if not values_readable(past):
                return False
            past = int(past)
        if past != 0:
            return False
    if attention_mask is not None:
        if (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2
                or attention_mask.shape[-1] != tokens or not values_readable(attention_mask)):
            return False
        if not bool(attention_mask.all()):
            return False
    if position_ids is not None:  # transformers reads restarting positions as packed sequences
        if not values_readable(position_ids):
            return False
        expected = torch.arange(tokens, device=position_ids.device)
        if position_ids.shape[-1] != tokens or not bool((position_ids == expected).all()):
            return False
    return True


def model_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                  inputs_embeds=None, use_cache=None, **kwargs):
    """Stock forward of a Llama-like decoder model (these parameters first, in stock's order),
    with ``CAUSAL_KWARG=True`` passed on to the layers when the mask is the plain causal one."""
    embedded = inputs_embeds if input_ids is None else input_ids
    if embedded is not None and embedded.dim() >= 2 and plain_causal(
            self, embedded.shape[1], attention_mask, position_ids, past_key_values):
        kwargs[CAUSAL_KWARG] = True
    return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                              **kwargs)


_PARAMETERS = ["self", "input_ids", "attention_mask", "position_ids", "past_key_values", "inputs_embeds", "use_cache"]


def patch_model(model: nn.Module, model_class: type, report) -> None:
    """Patches every ``model_class`` (the family's decoder stack) under ``model`` with
    :func:`model_forward`, if its forward takes stock's parameters in stock's order."""
    modules = [m for m in model.modules() if type(m) is model_class]
    if modules and list(inspect.signature(model_class.forward).parameters)[:len(_PARAMETERS)] != _PARAMETERS:
        report.skipped.append(f"{model_class.__name__}: its forward's parameters are not {_PARAMETERS[1:]}; "
                              "its causal mask stays materialized under torch.compile")
        return
    for module in modules:
        patch(module, model_forward)
        report.patched[MODEL_KIND] += 1

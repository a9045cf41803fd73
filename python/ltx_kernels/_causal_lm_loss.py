"""The loss of a ``*ForCausalLM`` under ``transformers.apply``: ``fused_linear_cross_entropy``
from the last hidden states, so training never materializes the ``[tokens, vocab]`` logits.

Stock computes ``logits = lm_head(hidden)`` and then ``ForCausalLMLoss`` (labels shifted by one,
``ignore_index=-100``, a sum over ``num_items_in_batch`` when the Trainer passes it, else the
mean). The patched forward does the same arithmetic in one op, but only where that is exactly
the stock computation: in train mode with ``labels``, the whole sequence's logits wanted
(``logits_to_keep=0``), the model's loss function the stock one, no logit soft-capping, and an
``lm_head`` that is a plain, unhooked ``nn.Linear`` in the hidden states' dtype (a LoRA or an
FP8 head keeps the stock path). It then returns ``logits=None``, as Liger-Kernel does: a
training step reads only the loss. In eval mode, without labels, or asked for a tuple
(``return_dict=False``), the forward is stock.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ltx_kernels import ops
from ltx_kernels._patching import Report, patch, runs_unhooked

KIND = "causal LM head + loss (fused_linear_cross_entropy)"


def _stock_loss():
    from transformers.loss.loss_utils import ForCausalLMLoss

    return ForCausalLMLoss


def unsupported(model: nn.Module) -> str | None:
    """Why ``model``'s loss stays stock, or None."""
    if not isinstance(getattr(model, "model", None), nn.Module) or not isinstance(getattr(model, "lm_head", None),
                                                                                   nn.Linear):
        return "no `model` decoder and `lm_head` Linear"
    if getattr(model.config, "final_logit_softcapping", None) is not None:
        return "logit soft-capping"
    if getattr(model, "loss_function", None) is not _stock_loss():
        return "a loss function other than ForCausalLMLoss"
    return None


def patch_causal_lm(model: nn.Module, report: Report) -> None:
    """Patches the ``*ForCausalLM`` in ``model`` (itself, or inside a peft wrapper, whose forward
    calls it). Only for the families ``transformers.apply`` dispatches on, whose forward is
    known to be ``lm_head`` then ``ForCausalLMLoss`` (others scale or cap their logits first,
    e.g. Granite's logits_scaling)."""
    for module in model.modules():
        name = type(module).__name__
        if not name.endswith("ForCausalLM") or type(module).__module__.startswith("peft"):
            continue
        problem = unsupported(module)
        if problem is None:
            patch(module, _forward)
            report.patched[KIND] += 1
        else:
            report.skipped.append(f"{name}: loss stays stock ({problem})")


def _fused_loss_applies(self: nn.Module, hidden: torch.Tensor) -> bool:
    head = self.lm_head
    return (type(head) is nn.Linear and runs_unhooked(head) and head.weight.dtype == hidden.dtype
            and (head.bias is None or head.bias.dtype == hidden.dtype))


def _forward(self: nn.Module, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
             inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    original = type(self).forward
    # As transformers' can_return_tuple decides (config.use_return_dict is deprecated in 5.x).
    return_dict = kwargs.get("return_dict")
    wants_tuple = not (getattr(self.config, "return_dict", True) if return_dict is None else return_dict)
    if (labels is None or not self.training or wants_tuple
            or not (isinstance(logits_to_keep, int) and logits_to_keep == 0)):
        return original(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        past_key_values=past_key_values, inputs_embeds=inputs_embeds, labels=labels,
                        use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    hidden = outputs.last_hidden_state
    head = self.lm_head
    if not _fused_loss_applies(self, hidden):  # e.g. a LoRA or a hook on the head: stock from here
        logits = head(hidden)
        loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
    else:
        logits = None
        # ForCausalLMLoss's arguments, as it reads them from the forward's kwargs
        ignore_index = kwargs.get("ignore_index", -100)
        shift_labels = kwargs.get("shift_labels")
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        num_items = kwargs.get("num_items_in_batch")
        target = shift_labels.to(hidden.device)

        reduction = "mean" if num_items is None else "sum"
        loss = ops.fused_linear_cross_entropy(hidden, head.weight, target, head.bias, ignore_index, reduction)
        if num_items is not None:
            loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)

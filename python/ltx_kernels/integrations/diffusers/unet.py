"""Stable Diffusion 1.x / 2.x and SDXL (diffusers' ``UNet2DConditionModel``): its GroupNorms on
``group_norm``, each with the SiLU (and the time embedding) around it in the same pass.

- ``ResnetBlock2D`` (``time_embedding_norm="default"``, SiLU, torch GroupNorms): norm1 + SiLU is
  one ``group_norm(activation="silu")``; ``x + time_emb_proj(temb)`` + norm2 + SiLU is one
  ``group_norm(add=..., activation="silu")``, the projected time embedding added per channel in
  fp32 inside the norm (stock rounds the sum to the model's dtype first). Convolutions,
  up/down-sampling, dropout, the shortcut, ``skip_time_act`` and ``output_scale_factor`` are
  stock's. A block of another configuration (``"scale_shift"``, another activation) stays
  stock, reported.
- ``Transformer2DModel``'s input GroupNorm: ``group_norm``.
- The model's ``conv_norm_out`` + ``conv_act`` (GroupNorm, SiLU): one ``group_norm(activation="silu")``.
- The ``BasicTransformerBlock``s' ``torch.nn.LayerNorm``s: ``layer_norm``.

:func:`patch_blocks` and :func:`patch_output` also serve the image VAE (:mod:`.vae`): ResNet
blocks without a time embedding, an attention module's own GroupNorm.

The GEGLU feed-forwards are patched by class (``gelu_and_mul``), as in any model; attention,
convolutions and linears stay diffusers', called as modules, so hooks, LoRA and FP8 linears
work on them. The norms' parameters are read at each call, after their hooks ran; a norm or
activation that a hook must see called (torch forward hooks, a cache's ``new_forward``) runs
unfused (``call_fused``).
"""

from __future__ import annotations

import torch
from torch import nn

from ltx_kernels import ops
from ltx_kernels._forwards import layer_norm_forward
from ltx_kernels._patching import call_fused, is_library_tensor, is_patched, patch, runs_unhooked
from ltx_kernels.integrations.family import Family

RESNET_KIND = "ResnetBlock2D (group_norm + SiLU, time embedding + group_norm + SiLU)"
TRANSFORMER_NORM_KIND = "Transformer2DModel input GroupNorm (group_norm)"
ATTENTION_NORM_KIND = "Attention group_norm (group_norm)"
OUTPUT_KIND = "conv_norm_out + conv_act (group_norm + SiLU)"
LAYER_NORM_KIND = "BasicTransformerBlock LayerNorm (layer_norm)"


def _group_norm(norm: nn.GroupNorm, x: torch.Tensor, add: torch.Tensor | None = None,
                act: nn.Module | None = None) -> torch.Tensor:
    """``act(norm(x + add[:, :, None, None]))`` (``add`` [N, C] or None, ``act`` a SiLU or None)
    as one ``group_norm`` reading ``norm``'s parameters now. Where the op does not take them (a
    weight in a dtype other than x's or fp32, a library's tensor subclass) or ``add`` is in
    another dtype, the modules' own forwards compute it, as stock (their hooks, if any, have
    run: this is called from the norm's forward or between its hooks)."""
    params = (norm.weight, norm.bias)
    if (any(is_library_tensor(p) or (p is not None and p.dtype not in (x.dtype, torch.float32)) for p in params)
            or (add is not None and add.dtype != x.dtype)):
        x = type(norm).forward(norm, x if add is None else x + add[:, :, None, None])
        return x if act is None else type(act).forward(act, x)
    return ops.group_norm(x, norm.num_groups, norm.weight, norm.bias, norm.eps, add=add,
                          activation=None if act is None else "silu")


def _norm_act(norm: nn.GroupNorm, act: nn.Module, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """A ResNet block's ``act(norm(x [+ add]))``: one ``group_norm`` between the two modules'
    hooks, or the modules called where a hook must see the call."""
    return call_fused((norm, act), lambda: _group_norm(norm, x, add, act),
                      lambda: act(norm(x if add is None else x + add[:, :, None, None])))


def _resnet_forward(self: nn.Module, input_tensor: torch.Tensor, temb: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``ResnetBlock2D.forward`` for time_embedding_norm "default" (or, without a time-embedding
    projection, any but "scale_shift": stock's norm2 then takes no embedding) with a SiLU, both norms fused
    (the deprecated ``scale`` argument is ignored, as stock ignores it); a block without a
    time-embedding projection (a VAE's) fuses norm2 + SiLU alone."""
    hidden_states = _norm_act(self.norm1, self.nonlinearity, input_tensor)
    if self.upsample is not None:
        if hidden_states.shape[0] >= 64:  # as stock: upsample_nearest_nhwc fails on large batches
            input_tensor = input_tensor.contiguous()
            hidden_states = hidden_states.contiguous()
        input_tensor = self.upsample(input_tensor)
        hidden_states = self.upsample(hidden_states)
    elif self.downsample is not None:
        input_tensor = self.downsample(input_tensor)
        hidden_states = self.downsample(hidden_states)
    hidden_states = self.conv1(hidden_states)
    add = None
    if self.time_emb_proj is not None:
        if not self.skip_time_act:
            temb = self.nonlinearity(temb)
        # [N, C]: added per (sample, channel) inside norm2's pass instead of as a [N, C, 1, 1] broadcast
        add = self.time_emb_proj(temb)
    elif temb is not None and self.time_embedding_norm == "default":
        hidden_states = hidden_states + temb  # (no projection: stock adds temb as given)
    hidden_states = _norm_act(self.norm2, self.nonlinearity, hidden_states, add)
    hidden_states = self.conv2(self.dropout(hidden_states))
    if self.conv_shortcut is not None:
        if self.training:  # as stock: DDP's gradient strides
            input_tensor = input_tensor.contiguous()
        input_tensor = self.conv_shortcut(input_tensor)
    return (input_tensor + hidden_states) / self.output_scale_factor


def _resnet_problem(block: nn.Module) -> str | None:
    # (another value without a time-embedding projection, e.g. a VAE decoder's "group", norms
    # without the embedding, as "default" without one does)
    if block.time_embedding_norm != "default" and block.time_emb_proj is not None:
        return f"time_embedding_norm is {block.time_embedding_norm!r} (fused: 'default')"
    if type(block.nonlinearity) is not nn.SiLU:
        return f"its nonlinearity is {type(block.nonlinearity).__name__} (fused: SiLU)"
    if not (type(block.norm1) is nn.GroupNorm and type(block.norm2) is nn.GroupNorm):
        return "norm1 / norm2 are not torch GroupNorms"
    return None


def _group_norm_forward(self: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """A GroupNorm's own forward (Transformer2DModel's input norm): ``group_norm``."""
    return _group_norm(self, x)


# The conv_norm_out and conv_act of a UNet (or of a VAE's encoder and decoder) are two modules
# that their owner's forward calls one after the other: conv_norm_out's forward computes the
# SiLU too and conv_act's passes its input through, when both decide so alike. Each holds the
# owner (in a tuple: not a submodule) to see the pair as the owner's forward will call it.

def _output_fused(owner: nn.Module) -> bool:
    """Whether conv_norm_out computes conv_act's SiLU: both are still the modules we patched
    and neither has a hook, which must see its module's own input and output."""
    norm, act = owner.conv_norm_out, owner.conv_act
    return is_patched(norm) and is_patched(act) and runs_unhooked(norm) and runs_unhooked(act)


def _norm_out_forward(self: nn.GroupNorm, sample: torch.Tensor) -> torch.Tensor:
    (owner,) = self._ltx_kernels_owner
    return _group_norm(self, sample, act=owner.conv_act if _output_fused(owner) else None)


def _act_out_forward(self: nn.Module, sample: torch.Tensor) -> torch.Tensor:
    (owner,) = self._ltx_kernels_owner
    return sample if _output_fused(owner) else type(self).forward(self, sample)


def _model_classes() -> tuple[type, ...]:
    from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel

    return (UNet2DConditionModel,)


def patch_blocks(model: nn.Module, report) -> None:
    """Patches the ResNet blocks, the transformers' input norms and LayerNorms, and the
    attention modules' own GroupNorms (a VAE's mid-block attention) inside ``model``."""
    from diffusers.models.attention import BasicTransformerBlock
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import ResnetBlock2D
    from diffusers.models.transformers.transformer_2d import Transformer2DModel

    for name, module in model.named_modules():
        if type(module) is ResnetBlock2D:
            why = _resnet_problem(module)
            if why is not None:
                report.skipped.append(f"{type(model).__name__}.{name} stays stock: {why}")
                continue
            patch(module, _resnet_forward)
            report.patched[RESNET_KIND] += 1
        elif isinstance(module, Transformer2DModel) and type(getattr(module, "norm", None)) is nn.GroupNorm:
            patch(module.norm, _group_norm_forward)
            report.patched[TRANSFORMER_NORM_KIND] += 1
        elif isinstance(module, Attention) and type(getattr(module, "group_norm", None)) is nn.GroupNorm:
            # (its processor calls it on a [B, C, H*W] transposed view: channels last for the op)
            patch(module.group_norm, _group_norm_forward)
            report.patched[ATTENTION_NORM_KIND] += 1
        elif type(module) is BasicTransformerBlock:
            for norm in (module.norm1, module.norm2, module.norm3):  # norm2 / norm3 may be None
                if type(norm) is nn.LayerNorm and len(norm.normalized_shape) == 1:
                    patch(norm, layer_norm_forward)
                    report.patched[LAYER_NORM_KIND] += 1


def patch_output(owner: nn.Module, report) -> None:
    """Patches ``owner``'s conv_norm_out + conv_act pair (a UNet's, a VAE encoder's or
    decoder's) into one group_norm + SiLU, where they are a GroupNorm and a SiLU."""
    if owner.conv_norm_out is None:  # norm_num_groups=None: no output norm
        return
    if type(owner.conv_norm_out) is nn.GroupNorm and type(owner.conv_act) is nn.SiLU:
        patch(owner.conv_norm_out, _norm_out_forward, _ltx_kernels_owner=(owner,))
        patch(owner.conv_act, _act_out_forward, _ltx_kernels_owner=(owner,))
        report.patched[OUTPUT_KIND] += 1
    else:
        report.skipped.append(f"{type(owner).__name__}.conv_norm_out + conv_act stay stock: they are "
                              f"{type(owner.conv_norm_out).__name__} + {type(owner.conv_act).__name__} "
                              "(fused: GroupNorm + SiLU)")


def patch_model(model: nn.Module, report, options) -> None:
    """Patches ``model``'s blocks (:func:`patch_blocks`) and its output norm + activation."""
    if any(is_patched(m) for m in model.modules()):
        return  # a second inject patches nothing new
    patch_blocks(model, report)
    patch_output(model, report)


FAMILY = Family("Stable Diffusion UNet", _model_classes, patch_model)

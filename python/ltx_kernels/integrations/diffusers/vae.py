"""The image VAE of Stable Diffusion 1.x / 2.x, SDXL, SD3 and FLUX (diffusers'
``AutoencoderKL``): its encoder's and decoder's ResNet blocks, mid-block attention norm and
output norm + SiLU on ``group_norm``, as in the UNet (:mod:`.unet`).

- ``ResnetBlock2D`` (no time embedding here): norm1 + SiLU and norm2 + SiLU, one
  ``group_norm(activation="silu")`` each.
- The mid-block ``Attention``'s own GroupNorm: ``group_norm`` (its processor hands it a
  ``[B, C, H*W]`` transposed view, which the op reads as channels last).
- The encoder's and the decoder's ``conv_norm_out`` + ``conv_act``: one
  ``group_norm(activation="silu")`` each.

A decode at 1024x1024 normalizes 128- to 512-channel maps of up to 1024x1024 positions: each
fused norm + SiLU saves a read and a write of such a map. Convolutions, up/down-sampling and
attention stay diffusers'.
"""

from __future__ import annotations

from torch import nn

from ltx_kernels._patching import is_patched
from ltx_kernels.integrations.family import Family

from .unet import patch_blocks, patch_output


def _model_classes() -> tuple[type, ...]:
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL

    return (AutoencoderKL,)


def patch_model(model: nn.Module, report, options) -> None:
    """Patches the encoder's and the decoder's blocks and output norms."""
    if any(is_patched(m) for m in model.modules()):
        return  # a second inject patches nothing new
    patch_blocks(model, report)
    for coder in (model.encoder, model.decoder):
        patch_output(coder, report)


FAMILY = Family("Stable Diffusion / FLUX image VAE", _model_classes, patch_model)

"""The diffusers model families :func:`ltx_kernels.diffusers.inject` knows, one module each:
LTX-Video (:mod:`.ltx_video`), LTX-2 (:mod:`.ltx2`), FLUX (:mod:`.flux`), SD3 / SD3.5 (:mod:`.sd3`), Wan 2.1 / 2.2
(:mod:`.wan`), PixArt / DiT (:mod:`.dit`), the Stable Diffusion UNet (:mod:`.unet`) and the image
VAE of SD / SDXL / SD3 / FLUX (:mod:`.vae`). A model of
another class gets the by-class patches alone (norms, activations; see :mod:`ltx_kernels.diffusers`)."""

from __future__ import annotations

from torch import nn

from ltx_kernels.integrations.family import Family

from . import dit, flux, ltx2, ltx_video, sd3, unet, vae, wan

FAMILIES: tuple[Family, ...] = (ltx_video.FAMILY, ltx2.FAMILY, flux.FAMILY, sd3.FAMILY, wan.FAMILY, dit.FAMILY,
                                unet.FAMILY, vae.FAMILY)


def family_of(module: nn.Module) -> Family | None:
    """The family whose model classes ``module`` is an instance of, or None."""
    return next((f for f in FAMILIES if isinstance(module, f.classes())), None)


def model_class_names() -> list[str]:
    """The model classes of every family, for messages."""
    return [cls.__name__ for family in FAMILIES for cls in family.classes()]

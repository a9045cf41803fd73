"""End-to-end image DiT benchmark (PixArt, DiT, SD3): one transformer step at full size,
random weights.

    python -m ltx_kernels.bench.dit_e2e --config pixart-sigma --json pixart.json --markdown pixart.md

``pixart-sigma``: PixArt-Σ XL/2's transformer at 1024x1024 (28 blocks, D = 1152, 16 heads of 72;
4096 image tokens), cross-attention to 300 T5 tokens; ``dit-xl``: DiT-XL/2 at 256x256
(class-conditional, 256 image tokens); ``sd35-large``: SD3.5-large's MMDiT at 1024x1024 (38
joint blocks, D = 2432, 38 heads of 64, QK RMSNorm), 333 text tokens (77 CLIP + 256 T5). bf16,
CFG batch 2. The modes of the FLUX benchmark (:mod:`ltx_kernels.bench.flux_e2e`), timed the
same way.
"""

from __future__ import annotations

import argparse

import torch

from ltx_kernels.bench import harness
from ltx_kernels.bench.flux_e2e import add_run_arguments, markdown, run
from ltx_kernels.bench.ltx_e2e import available_modes

_XL = dict(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=28, patch_size=2)
_TINY = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8, num_layers=2, patch_size=2,
             norm_num_groups=1)
# name -> (model class, its config, default image size in pixels, text tokens)
CONFIGS = {
    "pixart-sigma": ("PixArtTransformer2DModel", dict(_XL, cross_attention_dim=1152, sample_size=128,
                                                      caption_channels=4096, interpolation_scale=2,
                                                      use_additional_conditions=False), 1024, 300),
    "dit-xl": ("DiTTransformer2DModel", dict(_XL, sample_size=32), 256, 0),
    "pixart-tiny": ("PixArtTransformer2DModel", dict(_TINY, cross_attention_dim=32, sample_size=8, caption_channels=24,
                                                     use_additional_conditions=False), 64, 7),
    "dit-tiny": ("DiTTransformer2DModel", dict(_TINY, sample_size=8, num_embeds_ada_norm=10), 64, 0),
    "sd35-large": ("SD3Transformer2DModel", dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38,
                                                 attention_head_dim=64, num_attention_heads=38, joint_attention_dim=4096,
                                                 caption_projection_dim=2432, pooled_projection_dim=2048, out_channels=16,
                                                 pos_embed_max_size=192, qk_norm="rms_norm"), 1024, 333),
    "sd3-tiny": ("SD3Transformer2DModel", dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2,
                                               attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                               caption_projection_dim=32, pooled_projection_dim=16, out_channels=4,
                                               pos_embed_max_size=16, qk_norm="rms_norm"), 64, 5),
}


def random_transformer(config: str, dtype: torch.dtype, device):
    """The config's model with random weights, built in ``dtype`` on ``device``."""
    import diffusers

    cls, kwargs, _, _ = CONFIGS[config]
    return harness.random_model(getattr(diffusers, cls), kwargs, dtype, device)


def step_inputs(model, config: str, size: int, device) -> dict:
    """One CFG denoising step's inputs (batch 2: conditional and unconditional), seeded: VAE
    latents (8 pixels each), and the text states with their mask (PixArt), the text states
    and pooled projections (SD3), or class labels, the second the null class (DiT)."""
    g = torch.Generator(device=device).manual_seed(0)
    cfg, dtype = model.config, harness.model_dtype(model)
    latent = size // 8
    kw = dict(hidden_states=torch.randn(2, cfg.in_channels, latent, latent, generator=g, device=device, dtype=dtype),
              timestep=torch.tensor([500, 500], device=device), return_dict=False)
    text = CONFIGS[config][3]
    if CONFIGS[config][0] == "SD3Transformer2DModel":
        kw["encoder_hidden_states"] = torch.randn(2, text, cfg.joint_attention_dim, generator=g, device=device,
                                                  dtype=dtype)
        kw["pooled_projections"] = torch.randn(2, cfg.pooled_projection_dim, generator=g, device=device, dtype=dtype)
    elif text:
        kw["encoder_hidden_states"] = torch.randn(2, text, cfg.caption_channels, generator=g, device=device,
                                                  dtype=dtype)
        kw["encoder_attention_mask"] = torch.ones(2, text, device=device)
    else:
        kw["class_labels"] = torch.tensor([1, cfg.num_embeds_ada_norm], device=device)
    return kw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.dit_e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="pixart-sigma", choices=sorted(CONFIGS))
    parser.add_argument("--size", type=int, help="image side in pixels (default: the config's)")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the image DiT end-to-end benchmark")
    cls, config, default_size, text = CONFIGS[args.config]
    size = args.size or default_size
    meta = dict(harness.device_meta(None), config=args.config, size=size)
    modes = available_modes(args.modes)

    def fresh():
        return random_transformer(args.config, torch.bfloat16, "cuda")

    # image tokens: the latent (8 pixels each) in patches (the latents are [B, C, H, W]: not
    # the token count run() reads from FLUX's packed hidden_states)
    tokens = (size // 8 // config["patch_size"]) ** 2
    rows = run(fresh, lambda model: step_inputs(model, args.config, size, "cuda"), modes, args.reps, tokens)
    title = (f"{cls} ({args.config}), random weights, bf16, CFG batch 2, {size}x{size}"
             + (f", {text} text tokens" if text else ", class-conditional"))
    harness.write_report(markdown(rows, meta, title, args.reps), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

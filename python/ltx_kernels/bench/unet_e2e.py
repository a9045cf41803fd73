"""End-to-end UNet benchmark (SDXL, SD 1.5): one UNet2DConditionModel step at full size,
random weights.

    python -m ltx_kernels.bench.unet_e2e --config sdxl --json unet.json --markdown unet.md

``sdxl``: stabilityai/stable-diffusion-xl-base-1.0's UNet (2.57 B parameters) at 1024x1024
(128x128 latents; attention at 64x64 and 32x32, heads of 64), 77 text tokens of width 2048
(both CLIP encoders), the pooled text embedding and the six size / crop ids as
``added_cond_kwargs``; ``sd15``: Stable Diffusion 1.5's UNet (0.86 B) at 512x512 (64x64
latents, attention from 64x64 down to 8x8, 8 heads of 40, 80, 160), 77 tokens of width 768.
bf16, CFG batch 2. The modes of the FLUX benchmark (:mod:`ltx_kernels.bench.flux_e2e`), timed
the same way; its compile modes compile the UNet's transformer blocks
(``compile_repeated_blocks``), not its ResNet blocks. The report's image tokens are those of
the largest attention level.
"""

from __future__ import annotations

import argparse

import torch

from ltx_kernels.bench import harness
from ltx_kernels.bench.flux_e2e import add_run_arguments, markdown, run
from ltx_kernels.bench.ltx_e2e import available_modes

# Both text encoders are CLIP's, padded to 77 tokens.
TEXT_TOKENS = 77
# name -> (UNet2DConditionModel's config, default image size in pixels). The full-size ones are
# the checkpoints' unet/config.json less the entries equal to diffusers' defaults (SD 1.5's
# blocks are the defaults); diffusers' attention_head_dim is the number of heads here.
CONFIGS = {
    "sdxl": (dict(sample_size=128, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                  block_out_channels=(320, 640, 1280), attention_head_dim=(5, 10, 20),
                  transformer_layers_per_block=(1, 2, 10), cross_attention_dim=2048, use_linear_projection=True,
                  addition_embed_type="text_time", addition_time_embed_dim=256,
                  projection_class_embeddings_input_dim=2816), 1024),
    "sd15": (dict(sample_size=64, cross_attention_dim=768), 512),
    "sdxl-tiny": (dict(sample_size=8, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                       up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(32, 64),
                       attention_head_dim=(2, 4), transformer_layers_per_block=(1, 2), layers_per_block=1,
                       norm_num_groups=8, cross_attention_dim=32, use_linear_projection=True,
                       addition_embed_type="text_time", addition_time_embed_dim=8,
                       projection_class_embeddings_input_dim=16 + 6 * 8), 64),
    "sd15-tiny": (dict(sample_size=8, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), block_out_channels=(32, 64),
                       attention_head_dim=2, layers_per_block=1, norm_num_groups=8, cross_attention_dim=24), 64),
}


def random_unet(config: str, dtype: torch.dtype, device):
    """The config's UNet2DConditionModel with random weights, built in ``dtype`` on ``device``
    (``"meta"``: shapes only)."""
    from diffusers import UNet2DConditionModel

    return harness.random_model(UNet2DConditionModel, CONFIGS[config][0], dtype, device)


def step_inputs(model, size: int, device) -> dict:
    """One CFG denoising step's inputs (batch 2: conditional and unconditional), seeded: VAE
    latents (8 pixels each), the text states and, for SDXL's text_time conditioning, the pooled
    text embedding and the time ids (original size, crop corner, target size: the image's, as
    the SDXL pipeline sets them by default)."""
    g = torch.Generator(device=device).manual_seed(0)
    cfg, dtype = model.config, harness.model_dtype(model)
    latent = size // 8
    kw = dict(sample=torch.randn(2, cfg.in_channels, latent, latent, generator=g, device=device, dtype=dtype),
              timestep=torch.tensor([500, 500], device=device),
              encoder_hidden_states=torch.randn(2, TEXT_TOKENS, cfg.cross_attention_dim, generator=g, device=device,
                                                dtype=dtype),
              return_dict=False)
    if cfg.addition_embed_type == "text_time":
        pooled = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
        kw["added_cond_kwargs"] = dict(
            text_embeds=torch.randn(2, pooled, generator=g, device=device, dtype=dtype),
            time_ids=torch.tensor([[size, size, 0, 0, size, size]] * 2, device=device, dtype=dtype))
    return kw


def attention_tokens(model, size: int) -> int:
    """Tokens of the UNet's largest attention level at ``size`` pixels: the latent's, a quarter
    per down block before the first with attention (SDXL's first block has none)."""
    level = next(i for i, block in enumerate(model.config.down_block_types) if block.startswith("CrossAttn"))
    return (size // 8 >> level) ** 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.unet_e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="sdxl", choices=sorted(CONFIGS))
    parser.add_argument("--size", type=int, help="image side in pixels (default: the config's)")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the UNet end-to-end benchmark")
    size = args.size or CONFIGS[args.config][1]
    meta = dict(harness.device_meta(None), config=args.config, size=size)
    modes = available_modes(args.modes)

    def fresh():
        return random_unet(args.config, torch.bfloat16, "cuda")

    # Read from a weightless copy: stock is None when only the quantized modes run.
    tokens = attention_tokens(random_unet(args.config, torch.bfloat16, "meta"), size)
    rows = run(fresh, lambda model: step_inputs(model, size, "cuda"), modes, args.reps, tokens)
    title = (f"UNet2DConditionModel ({args.config}), random weights, bf16, CFG batch 2, {TEXT_TOKENS} text tokens, "
             f"{size}x{size}, {size // 8}x{size // 8} latents, largest attention level")
    harness.write_report(markdown(rows, meta, title, args.reps), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

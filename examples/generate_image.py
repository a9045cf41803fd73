"""Generate an image with diffusers' FLUX.1, SD3.5, SDXL or PixArt-Σ pipeline, optionally with
ltx_kernels.

    python examples/generate_image.py --family flux --prompt "A red fox in the snow" --output fox.png
    python examples/generate_image.py --family sdxl --prompt "A red fox in the snow" --output fox.png
    python examples/generate_image.py --family pixart --random-weights --compile --precision fp8

With the real model (``--model``: hub id or local path; default black-forest-labs/FLUX.1-dev,
stabilityai/stable-diffusion-3.5-large, stabilityai/stable-diffusion-xl-base-1.0 or
PixArt-alpha/PixArt-Sigma-XL-2-1024-MS) it writes a PNG; ``inject`` patches the pipeline's
denoiser and, for FLUX, SD3 and SDXL, its VAE (``AutoencoderKL``). ``--random-weights`` needs
no download: the denoiser (transformer or UNet) at full size (or ``--config`` tiny) with random
weights and synthetic text embeddings runs the pipeline's denoising loop (scheduler, CFG but
for FLUX) offline, and the latents are saved to ``--output`` with a ``.pt`` suffix (there is no
VAE to decode them).
Without a CUDA GPU the tiny config runs (a full-size one only with ``--allow-cpu``).
``--use-optimized-kernels`` (default), ``--precision fp8``, ``--attention bf16|8bit`` (FLUX's
attention goes through diffusers' dispatcher; PixArt's processor calls SDPA itself, so it
keeps it) and ``--compile`` combine, as in generate_video.py. Prints per-step and total time,
peak memory and what was patched.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

# family -> (pipeline class, default hub id, full-size and tiny random-weights configs, the
# pipeline's denoiser attribute, default guidance scale)
FAMILIES = {
    "flux": ("FluxPipeline", "black-forest-labs/FLUX.1-dev", "dev", "tiny", "transformer", 3.5),
    "sd3": ("StableDiffusion3Pipeline", "stabilityai/stable-diffusion-3.5-large", "sd35-large", "sd3-tiny",
            "transformer", 3.5),
    "sdxl": ("StableDiffusionXLPipeline", "stabilityai/stable-diffusion-xl-base-1.0", "sdxl", "sdxl-tiny", "unet", 5.0),
    "pixart": ("PixArtSigmaPipeline", "PixArt-alpha/PixArt-Sigma-XL-2-1024-MS", "pixart-sigma", "pixart-tiny",
               "transformer", 4.5),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="flux", choices=sorted(FAMILIES))
    p.add_argument("--model", help="hub id or local path (default: the family's)")
    p.add_argument("--prompt", default="A lighthouse on a cliff at dawn, waves crashing below, photorealistic")
    p.add_argument("--height", type=int, default=1024)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--steps", type=int, default=28)
    p.add_argument("--guidance-scale", type=float,
                   help="default: 3.5 (FLUX's distilled guidance, SD3.5's CFG), 5.0 (SDXL), 4.5 (PixArt)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--output", default="output.png")
    p.add_argument("--use-optimized-kernels", action="store_true", default=True, help="ltx_kernels (default)")
    p.add_argument("--no-optimized-kernels", dest="use_optimized_kernels", action="store_false")
    p.add_argument("--compile", action="store_true", help="torch.compile (fullgraph) of the denoiser's blocks")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp8"],
                   help="fp8: the blocks' linears in FP8 (inject(precision='fp8'); with the kernels only)")
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "bf16", "8bit"],
                   help="bf16 / 8bit: ltx_kernels.attention as the diffusers attention backend (with the kernels only)")
    p.add_argument("--random-weights", action="store_true", help="offline: random denoiser, no text encoder/VAE")
    p.add_argument("--config", choices=["full", "tiny"], help="with --random-weights (default: full on a GPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--allow-cpu", action="store_true", help="run a full-size model on the CPU (minutes per step)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = p.parse_args(argv)
    if args.guidance_scale is None:
        args.guidance_scale = FAMILIES[args.family][5]
    if (args.precision == "fp8" or args.attention != "sdpa") and not args.use_optimized_kernels:
        raise SystemExit("--precision fp8 and --attention bf16/8bit run through ltx_kernels: drop --no-optimized-kernels")
    if args.device.startswith("cuda"):
        args.config = args.config or "full"
        return args
    if args.random_weights and args.config is None:
        args.config = "tiny"
        print("no CUDA GPU found: running the tiny random-weights config on the CPU")
    if (not args.random_weights or args.config == "full") and not args.allow_cpu:
        raise SystemExit("no CUDA GPU: a full-size model on the CPU takes minutes per step. Pass --allow-cpu to run "
                         "it anyway, or --random-weights for the tiny config.")
    return args


def load_pipeline(args):
    """(pipeline, the call's prompt arguments): the real one from the hub, or one around a
    random denoiser with no text encoders or VAE, fed synthetic embeddings."""
    import diffusers

    pipeline_class, hub_id, full, tiny = FAMILIES[args.family][:4]
    dtype = getattr(torch, args.dtype)
    if not args.random_weights:
        pipe = getattr(diffusers, pipeline_class).from_pretrained(args.model or hub_id, torch_dtype=dtype)
        return pipe.to(args.device), dict(prompt=args.prompt)
    from ltx_kernels.bench import dit_e2e, flux_e2e, unet_e2e

    config = full if args.config == "full" else tiny
    g = torch.Generator().manual_seed(args.seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(args.device, dtype)
    if args.family == "flux":
        transformer = flux_e2e.random_transformer(config, dtype, args.device)
        cfg = transformer.config
        pipe = diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=None,
                                      text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                      transformer=transformer)
        prompt = dict(prompt_embeds=randn(1, 512, cfg.joint_attention_dim),
                      pooled_prompt_embeds=randn(1, cfg.pooled_projection_dim))
    elif args.family == "sd3":
        transformer = dit_e2e.random_transformer(config, dtype, args.device)
        cfg = transformer.config
        pipe = diffusers.StableDiffusion3Pipeline(
            transformer=transformer, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=None, text_encoder=None,
            tokenizer=None, text_encoder_2=None, tokenizer_2=None, text_encoder_3=None, tokenizer_3=None)
        text = dit_e2e.CONFIGS[config][3]
        prompt = dict(prompt_embeds=randn(1, text, cfg.joint_attention_dim),
                      negative_prompt_embeds=randn(1, text, cfg.joint_attention_dim),
                      pooled_prompt_embeds=randn(1, cfg.pooled_projection_dim),
                      negative_pooled_prompt_embeds=randn(1, cfg.pooled_projection_dim))
    elif args.family == "sdxl":
        unet = unet_e2e.random_unet(config, dtype, args.device)
        cfg = unet.config
        pipe = diffusers.StableDiffusionXLPipeline(vae=None, text_encoder=None, text_encoder_2=None, tokenizer=None,
                                                   tokenizer_2=None, unet=unet,
                                                   scheduler=diffusers.EulerDiscreteScheduler())
        # the pooled text embedding: what the added-condition projection takes besides the 6 time ids
        pooled = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
        prompt = dict(prompt_embeds=randn(1, unet_e2e.TEXT_TOKENS, cfg.cross_attention_dim),
                      negative_prompt_embeds=randn(1, unet_e2e.TEXT_TOKENS, cfg.cross_attention_dim),
                      pooled_prompt_embeds=randn(1, pooled), negative_pooled_prompt_embeds=randn(1, pooled))
    else:
        transformer = dit_e2e.random_transformer(config, dtype, args.device)
        cfg = transformer.config
        pipe = diffusers.PixArtSigmaPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=transformer,
                                             scheduler=diffusers.DPMSolverMultistepScheduler())
        text = dit_e2e.CONFIGS[config][3]
        mask = torch.ones(1, text, device=args.device)
        prompt = dict(negative_prompt=None, prompt_embeds=randn(1, text, cfg.caption_channels), prompt_attention_mask=mask,
                      negative_prompt_embeds=randn(1, text, cfg.caption_channels), negative_prompt_attention_mask=mask,
                      use_resolution_binning=False)
    return pipe, dict(prompt, output_type="latent")


def main(argv=None) -> dict:
    args = parse_args(argv)
    pipe, inputs = load_pipeline(args)
    kernels = "off"
    if args.use_optimized_kernels:
        import ltx_kernels.diffusers

        attention = None if args.attention == "sdpa" else args.attention
        report = ltx_kernels.diffusers.inject(pipe, precision=args.precision, attention=attention)
        print(report)
        kernels = dict(report.patched)
    if args.compile:
        from ltx_kernels.bench.ltx_e2e import compile_blocks

        compile_blocks(getattr(pipe, FAMILIES[args.family][4]))

    cuda = args.device.startswith("cuda")
    step_ends: list[float] = []

    def on_step():
        if cuda:
            torch.cuda.synchronize()
        step_ends.append(time.perf_counter())

    if args.family == "pixart":  # (its pipeline has the older per-step callback)
        step_hook = dict(callback=lambda step, timestep, latents: on_step(), callback_steps=1)
    else:
        step_hook = dict(callback_on_step_end=lambda pipeline, step, timestep, kwargs: on_step() or kwargs)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    images = pipe(**inputs, height=args.height, width=args.width, num_inference_steps=args.steps,
                  guidance_scale=args.guidance_scale, generator=torch.Generator(device=args.device).manual_seed(args.seed),
                  **step_hook).images
    total = time.perf_counter() - start
    steps_ms = [1e3 * (b - a) for a, b in zip([start] + step_ends[:-1], step_ends)]

    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if args.random_weights:
        output = output.with_suffix(".pt")
        torch.save(images.cpu(), output)
    else:
        images[0].save(output)
    from ltx_kernels.bench.harness import peak_memory_gib

    peak, peak_what = peak_memory_gib(cuda)
    summary = dict(total_s=total, step_ms=steps_ms, mean_step_ms=sum(steps_ms) / max(len(steps_ms), 1), peak_gib=peak,
                   kernels=kernels, family=args.family, config=args.config if args.random_weights else args.model,
                   output=str(output))
    print("per-step ms: " + " ".join(f"{t:.1f}" for t in steps_ms))
    print(f"{args.family} on {args.device}, {len(steps_ms)} steps: total {total:.2f} s, mean step "
          f"{summary['mean_step_ms']:.1f} ms, peak memory {peak:.2f} GiB ({peak_what}), optimized kernels: "
          f"{'on' if args.use_optimized_kernels else 'off'}, precision {args.precision}, attention {args.attention}, "
          f"compile {args.compile}; wrote {output}" + (" (latents)" if args.random_weights else ""))
    return summary


if __name__ == "__main__":
    main()

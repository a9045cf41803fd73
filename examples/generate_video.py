"""Generate a video with diffusers' LTXPipeline, optionally with ltx_kernels and torch.compile.

    python examples/generate_video.py --prompt "A cat on a skateboard" --output cat.mp4
    python examples/generate_video.py --random-weights --config 2b --num-frames 161 --compile

With the real model (``--model``: hub id or local path of Lightricks/LTX-Video) it writes an
mp4. ``--random-weights`` needs no download: a transformer of ``--config`` with random weights
and synthetic text embeddings runs the same denoising loop (scheduler, CFG) offline and the
latents are saved to ``--output`` with a ``.pt`` suffix (there is no VAE to decode them).
``--use-optimized-kernels`` (default), ``--precision fp8`` (the transformer blocks' linears in
FP8; needs compute capability >= 8.9) and ``--compile`` combine. Prints per-step and total
time, peak GPU memory and which kernels were patched in.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="Lightricks/LTX-Video", help="hub id or local path")
    p.add_argument("--prompt", default="A woman walks through a neon-lit city street at night, rain reflecting the lights")
    p.add_argument("--negative-prompt", default="worst quality, inconsistent motion, blurry, jittery, distorted")
    p.add_argument("--num-frames", type=int, default=49)
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--guidance-scale", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--output", default="output.mp4")
    p.add_argument("--fps", type=int, default=25)
    p.add_argument("--batch-size", type=int, default=1, help="videos per call")
    p.add_argument("--warmup-iterations", type=int, default=0, help="untimed runs first (compilation)")
    p.add_argument("--use-optimized-kernels", action="store_true", default=True, help="ltx_kernels (default)")
    p.add_argument("--no-optimized-kernels", dest="use_optimized_kernels", action="store_false")
    p.add_argument("--compile", action="store_true", help="compile_repeated_blocks(fullgraph=True)")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp8"],
                   help="fp8: the blocks' linears in FP8 (inject(precision='fp8'); with the kernels only)")
    p.add_argument("--random-weights", action="store_true", help="offline: random transformer, no text encoder/VAE")
    p.add_argument("--config", default="2b", choices=["tiny", "2b", "13b"], help="with --random-weights")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    return p.parse_args(argv)


def load_pipeline(args):
    dtype = getattr(torch, args.dtype)
    if args.random_weights:
        from ltx_kernels.bench import ltx_models

        transformer = ltx_models.random_transformer(args.config, dtype, args.device)
        pipe = ltx_models.random_pipeline(transformer)
        embeds = ltx_models.prompt_embeds(transformer, args.batch_size)
        return pipe, dict(embeds, output_type="latent")
    from diffusers import LTXPipeline

    pipe = LTXPipeline.from_pretrained(args.model, torch_dtype=dtype).to(args.device)
    return pipe, dict(prompt=[args.prompt] * args.batch_size, negative_prompt=[args.negative_prompt] * args.batch_size)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.precision == "fp8" and not args.use_optimized_kernels:
        raise SystemExit("--precision fp8 runs through ltx_kernels: drop --no-optimized-kernels")
    pipe, inputs = load_pipeline(args)
    kernels = "off"
    if args.use_optimized_kernels:
        import ltx_kernels.diffusers

        report = ltx_kernels.diffusers.inject(pipe, precision=args.precision)
        print(report)
        kernels = dict(report.patched)
    if args.compile:
        pipe.transformer.compile_repeated_blocks(fullgraph=True)

    cuda = args.device.startswith("cuda")
    step_ends: list[float] = []

    def on_step_end(pipeline, step, timestep, callback_kwargs):
        if cuda:
            torch.cuda.synchronize()
        step_ends.append(time.perf_counter())
        return callback_kwargs

    def generate():
        step_ends.clear()
        generator = torch.Generator(device=args.device).manual_seed(args.seed)
        return pipe(**inputs, num_frames=args.num_frames, height=args.height, width=args.width,
                    num_inference_steps=args.steps, guidance_scale=args.guidance_scale,
                    generator=generator, callback_on_step_end=on_step_end)

    for i in range(args.warmup_iterations):
        t0 = time.perf_counter()
        generate()
        print(f"warm-up {i + 1}/{args.warmup_iterations}: {time.perf_counter() - t0:.2f} s")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    frames = generate().frames
    if cuda:
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    steps_ms = [1e3 * (b - a) for a, b in zip([start] + step_ends[:-1], step_ends)]

    output = Path(args.output)
    if args.random_weights:
        output = output.with_suffix(".pt")
        torch.save(frames.cpu(), output)
    else:
        from diffusers.utils import export_to_video

        for i, video in enumerate(frames):
            path = output if len(frames) == 1 else output.with_stem(f"{output.stem}_{i}")
            export_to_video(video, str(path), fps=args.fps)

    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    summary = dict(
        total_s=total, step_ms=steps_ms, mean_step_ms=sum(steps_ms) / max(len(steps_ms), 1),
        peak_gib=peak, kernels=kernels, compile=args.compile, precision=args.precision, output=str(output),
    )
    print("per-step ms: " + " ".join(f"{t:.1f}" for t in steps_ms))
    print(f"total {total:.2f} s, mean step {summary['mean_step_ms']:.1f} ms, peak memory {peak:.2f} GiB, "
          f"optimized kernels: {'on' if args.use_optimized_kernels else 'off'}, precision: {args.precision}, "
          f"compile: {args.compile}, "
          f"wrote {output}")
    return summary


if __name__ == "__main__":
    main()

"""Generate a video with diffusers' LTXPipeline, optionally with ltx_kernels and torch.compile.

    python examples/generate_video.py --prompt "A cat on a skateboard" --output cat.mp4
    python examples/generate_video.py --random-weights --config 2b --num-frames 161 --compile

With the real model (``--model``: hub id or local path of Lightricks/LTX-Video) it writes an
mp4. ``--random-weights`` needs no download: a transformer of ``--config`` with random weights
and synthetic text embeddings runs the same denoising loop (scheduler, CFG) offline and the
latents are saved to ``--output`` with a ``.pt`` suffix (there is no VAE to decode them), with a
``.png`` preview of the first latent frame. Without a CUDA GPU it says so and runs the tiny
config (a full-size one only with ``--allow-cpu``). Prints the wall time split: text encoder,
denoising steps, VAE decode, other.
``--use-optimized-kernels`` (default), ``--precision fp8`` (the transformer blocks' linears in
FP8; needs compute capability >= 8.9), ``--attention bf16|8bit`` (ltx_kernels' attention as the
model's diffusers attention backend instead of SDPA; on CUDA it takes head dim 64 or 128, so
not the tiny config) and ``--compile`` combine. Prints per-step and total time, peak GPU memory
and which kernels were patched in.

On several GPUs, under ``torchrun --nproc-per-node N examples/generate_video.py --parallel ...``:
``cfg`` splits each step's CFG batch over the ranks (``ltx_kernels.cfg_parallel``; N = 2 for one
prompt), ``ulysses`` / ``ring`` split the sequence (diffusers' context parallelism,
``ContextParallelConfig(ulysses_degree=N)`` / ``ring_degree=N``). Every rank runs the same
pipeline with the same seed; rank 0 alone writes the output and prints.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


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
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "bf16", "8bit"],
                   help="sdpa: the model's attention as diffusers sets it; bf16 / 8bit: ltx_kernels.attention "
                        "(inject(attention=...); with the kernels only)")
    p.add_argument("--random-weights", action="store_true", help="offline: random transformer, no text encoder/VAE")
    p.add_argument("--config", choices=["tiny", "2b", "13b"],
                   help="with --random-weights (default: 2b on a GPU, tiny on the CPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--allow-cpu", action="store_true", help="run a full-size model on the CPU (about a minute per step)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--parallel", choices=["cfg", "ulysses", "ring"],
                   help="under torchrun: the CFG batch (cfg) or the sequence (ulysses, ring) over the ranks")
    args = p.parse_args(argv)
    return check_device(start_ranks(args))


def start_ranks(args: argparse.Namespace) -> argparse.Namespace:
    """--parallel: joins torchrun's process group (NCCL on GPUs, gloo on the CPU), each rank on
    the GPU of its local rank."""
    if args.parallel is None:
        return args
    if "RANK" not in os.environ:
        raise SystemExit(f"--parallel {args.parallel} runs under torchrun: torchrun --nproc-per-node N "
                         "examples/generate_video.py ...")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device.startswith("cuda"):
        args.device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
    return args


def enable_parallel(pipe, args: argparse.Namespace) -> None:
    if args.parallel == "cfg":
        from ltx_kernels.cfg_parallel import enable_cfg_parallel

        enable_cfg_parallel(pipe.transformer)
    elif args.parallel is not None:
        from diffusers import ContextParallelConfig

        pipe.transformer.enable_parallelism(
            config=ContextParallelConfig(**{f"{args.parallel}_degree": dist.get_world_size()}))


def check_device(args: argparse.Namespace) -> argparse.Namespace:
    """Without a GPU the tiny config runs (said in one line); a full-size model on the CPU only
    when asked for explicitly with --allow-cpu."""
    if args.device.startswith("cuda"):
        args.config = args.config or "2b"
        return args
    full_size = (args.random_weights and args.config in ("2b", "13b")) or not args.random_weights
    if full_size and not args.allow_cpu:
        what = f"the {args.config} config" if args.random_weights else args.model
        raise SystemExit(f"no CUDA GPU: {what} on the CPU takes about a minute per step ({args.steps} steps). "
                         "Pass --allow-cpu to run it anyway, or drop --config for the tiny one.")
    if args.config is None:
        args.config = "tiny"
        print("no CUDA GPU found: running the tiny random-weights config on the CPU "
              "(the full-size model needs a GPU, or --config 2b --allow-cpu)")
    return args


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
    if args.attention != "sdpa" and not args.use_optimized_kernels:
        raise SystemExit(f"--attention {args.attention} runs through ltx_kernels: drop --no-optimized-kernels")
    pipe, inputs = load_pipeline(args)
    enable_parallel(pipe, args)
    kernels = "off"
    if args.use_optimized_kernels:
        import ltx_kernels.diffusers

        attention = None if args.attention == "sdpa" else args.attention
        report = ltx_kernels.diffusers.inject(pipe, precision=args.precision, attention=attention)
        print(report)
        kernels = dict(report.patched)
    if args.compile:
        pipe.transformer.compile_repeated_blocks(fullgraph=True)

    cuda = args.device.startswith("cuda")
    step_ends: list[float] = []
    phases = time_phases(pipe, cuda)

    def on_step_end(pipeline, step, timestep, callback_kwargs):
        if cuda:
            torch.cuda.synchronize()
        step_ends.append(time.perf_counter())
        return callback_kwargs

    def generate():
        step_ends.clear()
        phases.update(dict.fromkeys(phases, 0.0))
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
    # A step runs from the previous step's end; the first from the text encoder's end, so it
    # includes preparing the latents.
    denoise_start = start + phases["text encoder"]
    steps_ms = [1e3 * (b - a) for a, b in zip([denoise_start] + step_ends[:-1], step_ends)]
    split_s = {"text encoder": phases["text encoder"], "denoising": sum(steps_ms) / 1e3,
               "VAE decode": phases["VAE decode"]}
    split_s["other"] = max(total - sum(split_s.values()), 0.0)

    if args.parallel is not None:
        dist.barrier()  # every rank done before rank 0 writes and any rank tears down
        if dist.get_rank() != 0:
            dist.destroy_process_group()
            return {}
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if args.random_weights:
        output = output.with_suffix(".pt")
        torch.save(frames.cpu(), output)
        preview = save_preview(frames, args, output.with_suffix(".png"))
    else:
        from diffusers.utils import export_to_video

        for i, video in enumerate(frames):
            path = output if len(frames) == 1 else output.with_stem(f"{output.stem}_{i}")
            export_to_video(video, str(path), fps=args.fps)

    from ltx_kernels.bench.harness import peak_memory_gib

    peak, peak_what = peak_memory_gib(cuda)
    summary = dict(
        total_s=total, split_s=split_s, step_ms=steps_ms, mean_step_ms=sum(steps_ms) / max(len(steps_ms), 1),
        peak_gib=peak, kernels=kernels, compile=args.compile, precision=args.precision, attention=args.attention,
        output=str(output),
        device=args.device, config=args.config if args.random_weights else args.model,
    )
    print("per-step ms: " + " ".join(f"{t:.1f}" for t in steps_ms))
    print("wall time split: " + ", ".join(f"{name} {t:.2f} s" for name, t in split_s.items())
          + ("" if getattr(pipe, "vae", None) is not None else " (no VAE: latents out)"))
    print(f"device {args.device}, {summary['config']}, {len(steps_ms)} steps: total {total:.2f} s, mean step "
          f"{summary['mean_step_ms']:.1f} ms, peak memory {peak:.2f} GiB ({peak_what}), optimized kernels: "
          f"{'on' if args.use_optimized_kernels else 'off'}, precision: {args.precision}, attention: {args.attention}, "
          f"compile: {args.compile}; "
          f"wrote {output}" + (f" (latents) and {preview} (their first frame, channels 0-2 as RGB)"
                               if args.random_weights else ""))
    if args.parallel is not None:
        dist.destroy_process_group()
    return summary


def time_phases(pipe, cuda: bool) -> dict:
    """Seconds the pipeline spends in its text encoder (encode_prompt) and its VAE decode, per
    call, measured by wrapping the two on this pipeline instance (GPU work synchronized)."""
    phases = {"text encoder": 0.0, "VAE decode": 0.0}

    def timed(name, fn):
        def run(*args, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
            phases[name] += time.perf_counter() - t0
            return out

        return run

    pipe.encode_prompt = timed("text encoder", pipe.encode_prompt)
    if getattr(pipe, "vae", None) is not None:
        pipe.vae.decode = timed("VAE decode", pipe.vae.decode)
    return phases


def save_preview(latents: torch.Tensor, args: argparse.Namespace, path: Path) -> Path:
    """The first video's first latent frame as an image: channels 0-2 as RGB, each stretched
    to its own range, scaled up 8x (random weights give no decodable video: no VAE)."""
    from PIL import Image

    from ltx_kernels.bench import ltx_models

    _, h, w = ltx_models.latent_grid(args.num_frames, args.height, args.width)
    frame = latents[0, : h * w, :3].float().cpu().reshape(h, w, -1)
    lo, hi = frame.amin(dim=(0, 1)), frame.amax(dim=(0, 1))
    rgb = ((frame - lo) / (hi - lo).clamp(min=1e-12) * 255).round().to(torch.uint8)
    if rgb.shape[-1] < 3:  # fewer than 3 latent channels: grey
        rgb = rgb[..., :1].expand(h, w, 3)
    Image.fromarray(rgb.numpy()).resize((w * 8, h * 8), Image.NEAREST).save(path)
    return path


if __name__ == "__main__":
    main()

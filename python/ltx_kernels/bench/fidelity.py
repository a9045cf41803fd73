"""Fidelity benchmark: how far each mode's denoise lands from the same model in fp32.

    python -m ltx_kernels.bench.fidelity --json fidelity.json --markdown fidelity.md

LTX-Video (``--config``, random weights, seed 0), 49 frames 512x768, CFG 3, synthetic prompt
embeddings: LTXPipeline runs a ``--steps``-step denoise from the same noise in fp32 (the
reference) and in each mode, and the relative L2 distance of the final latents to the fp32
ones is reported; "1 step" is one transformer forward (CFG batch 2, timestep 500), whose
output is compared the same way (a 1-step denoise is undefined with LTX's scheduler, whose
terminal shift divides by zero at one step). Modes: bf16 eager, ours bf16 (``inject``), ours FP8
(``inject(precision="fp8")``), ours FP8 with our exact or 8-bit attention
(``inject(precision="fp8", attention="bf16" | "8bit")``) and torchao FP8 row-wise (skipped with a message
when torchao is not installed). Every mode starts from the fp32 weights cast to bf16.
``--fp8-skip`` keeps more linears of the FP8 modes in bf16 (benchmarks/results/h100/
fidelity_fp8_skip.md: which ones carry FP8's error).
"""

from __future__ import annotations

import argparse
import sys

import torch

from ltx_kernels.bench import harness, ltx_models
from ltx_kernels.bench.ltx_e2e import available_modes

MODES = ["eager", "ours", "ours-fp8", "ours-fp8+attnbf16", "ours-fp8+attn8bit", "torchao-fp8"]


def _prepare(reference_model, mode: str, fp8_skip: tuple[str, ...] = ()):
    import copy

    import ltx_kernels.diffusers as lkd
    from ltx_kernels._fp8 import DEFAULT_FP8_SKIP
    from ltx_kernels.bench.ltx_e2e import _torchao_fp8

    model = copy.deepcopy(reference_model).to(torch.bfloat16)
    skip = DEFAULT_FP8_SKIP + tuple(fp8_skip)
    if mode == "ours":
        lkd.inject(model)
    elif mode == "ours-fp8":
        lkd.inject(model, precision="fp8", fp8_skip=skip)
    elif mode.startswith("ours-fp8+attn"):
        lkd.inject(model, precision="fp8", fp8_skip=skip, attention=mode.removeprefix("ours-fp8+attn"))
    elif mode == "torchao-fp8":
        _torchao_fp8(model)
    return model


def _denoise(model, steps: int, frames: int, height: int, width: int) -> torch.Tensor:
    pipe = ltx_models.random_pipeline(model)
    pipe.set_progress_bar_config(disable=True)
    embeds = ltx_models.prompt_embeds(model, batch=1)
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        latents = pipe(**embeds, num_frames=frames, height=height, width=width, num_inference_steps=steps,
                       guidance_scale=3.0, output_type="latent", generator=generator).frames
    return latents.float()


def _one_step(model, frames: int, height: int, width: int) -> torch.Tensor:
    kw = ltx_models.step_inputs(model, batch=2, num_frames=frames, height=height, width=width)
    with torch.no_grad():
        return model(**kw)[0].float()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.fidelity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="2b", choices=["2b", "13b", "tiny"])
    parser.add_argument("--frames", type=int, default=49)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    parser.add_argument("--fp8-skip", nargs="+", default=[], metavar="PATTERN",
                        help="linears kept in bf16 by the ours-fp8 modes, beside inject's default fp8_skip "
                             "(fnmatch patterns of qualified names, e.g. '*.attn2.to_out.0')")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the fidelity benchmark")
    modes = available_modes(args.modes)
    reference_model = ltx_models.random_transformer(args.config, torch.float32, "cuda")
    size = (args.frames, args.height, args.width)
    reference = _denoise(reference_model, args.steps, *size), _one_step(reference_model, *size)
    rows = []
    for mode in modes:
        model = _prepare(reference_model, mode, tuple(args.fp8_skip))
        row = {"mode": mode,
               f"err_{args.steps}_steps": harness.rel_err(_denoise(model, args.steps, *size), reference[0]),
               "err_1_step": harness.rel_err(_one_step(model, *size), reference[1])}
        rows.append(row)
        print(row, flush=True)
        del model
        harness.release_memory()
    meta = dict(harness.device_meta(None), config=args.config, frames=args.frames, steps=args.steps,
                fp8_skip_extra=args.fp8_skip)
    extra = f" FP8 modes also keep {', '.join(args.fp8_skip)} in bf16." if args.fp8_skip else ""
    lines = [f"LTX-Video {args.config}, random weights, {args.frames} frames {args.height}x{args.width}, CFG 3; "
             f"{meta['gpu']}, torch {meta['torch']}. Relative L2 distance of the final latents to the fp32 "
             f"model's.{extra}\n",
             f"| mode | {args.steps}-step denoise | 1 step (one forward) |", "|---|---|---|"]
    lines += [f"| {r['mode']} | {r[f'err_{args.steps}_steps']:.2e} | {r['err_1_step']:.2e} |" for r in rows]
    harness.write_report("\n".join(lines) + "\n", meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

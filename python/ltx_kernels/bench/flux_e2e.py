"""End-to-end FLUX.1 benchmark: one transformer step at full size, random weights.

    python -m ltx_kernels.bench.flux_e2e --json flux.json --markdown flux.md

FLUX.1-dev's transformer (19 double-stream and 38 single-stream blocks, D = 3072, 24 heads of
128), bf16, batch 1 (guidance-distilled: no CFG), 512 text tokens, 1024x1024 (4096 image
tokens) unless ``--height`` / ``--width`` say otherwise. The modes of the LTX-Video benchmark
(:mod:`ltx_kernels.bench.ltx_e2e`: stock eager and torch.compile of the repeated blocks, ours,
ours + compile, ours in a CUDA graph, ours in FP8, the torchao FP8 anchor), each timed as the
median of ``--reps`` CUDA-event-timed forwards after warm-up, with peak memory, the kernel split
(GEMM / attention / other) and the output's error against stock eager.
"""

from __future__ import annotations

import argparse

import torch

from ltx_kernels.bench import harness
from ltx_kernels.bench.ltx_e2e import QUANTIZED, available_modes, each_mode, measure_step

MODES = ["eager", "compile", "ours", "ours+compile", "ours+cudagraph", "ours-fp8", "ours-fp8+compile",
         "torchao-fp8+compile"]
# ours with diffusers' native SDPA chosen for every attention (what the default routing gives
# where our kernel is not the faster, _diffusers_attention.prefers_ours): run on request, to
# measure the routing's share of a step.
SDPA_MODES = ["ours+attnsdpa", "ours-fp8+attnsdpa"]
CONFIGS = {
    "dev": dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                axes_dims_rope=(16, 56, 56)),
    "tiny": dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=32,
                 num_attention_heads=2, joint_attention_dim=48, pooled_projection_dim=16, guidance_embeds=True,
                 axes_dims_rope=(8, 12, 12)),
}


def random_transformer(config: str, dtype: torch.dtype, device):
    """FluxTransformer2DModel with random weights, built in ``dtype`` on ``device``."""
    from diffusers import FluxTransformer2DModel

    return harness.random_model(FluxTransformer2DModel, CONFIGS[config], dtype, device)


def step_inputs(model, height: int, width: int, text_tokens: int, device) -> dict:
    """One denoising step's inputs: latents packed 2x2 (16 x 16 pixels per token), seeded."""
    g = torch.Generator(device=device).manual_seed(0)
    cfg, dtype = model.config, harness.model_dtype(model)
    h, w = height // 16, width // 16
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(h * 1.0), torch.arange(w * 1.0), indexing="ij"))
    return dict(
        hidden_states=torch.randn(1, h * w, cfg.in_channels, generator=g, device=device, dtype=dtype),
        encoder_hidden_states=torch.randn(1, text_tokens, cfg.joint_attention_dim, generator=g, device=device,
                                          dtype=dtype),
        pooled_projections=torch.randn(1, cfg.pooled_projection_dim, generator=g, device=device, dtype=dtype),
        timestep=torch.tensor([0.5], device=device, dtype=dtype),
        guidance=torch.tensor([3.5], device=device, dtype=dtype) if cfg.guidance_embeds else None,
        img_ids=ids.reshape(3, -1).T.to(device), txt_ids=torch.zeros(text_tokens, 3, device=device),
        return_dict=False,
    )


def run(fresh, inputs, modes, reps: int, tokens: int | None = None) -> list[dict]:
    """Times one step per mode: ``fresh()`` builds the model, once for the modes that keep the
    weights (not at all if only quantized modes run, so that their peak memory is their own) and
    anew for each quantized one; ``inputs(model)`` the step's kwargs, ``tokens``
    the image tokens the report names (default: dimension 1 of the kwargs' ``hidden_states``,
    FLUX's packed tokens; a UNet takes ``sample`` instead). Shared by the image-model benchmarks."""
    reference, rows = None, []
    stock = fresh() if any(m not in QUANTIZED for m in modes) else None
    for mode, model in each_mode(stock, fresh, modes):
        kw = inputs(model)
        row = {"mode": mode, "tokens": tokens or kw["hidden_states"].shape[1]}
        with torch.no_grad():
            reference = measure_step(lambda: model(**kw)[0], mode, reps, reference, row)
        rows.append(row)
        print(_row_line(row), flush=True)
        del model
    return rows


def _row_line(r: dict) -> str:
    return (f"| {r['mode']} | {r['step_ms']:.1f} | {r['peak_mem_gib']:.2f} | {harness.split_text(r['kernels_ms'])} | "
            f"{r['err_vs_eager']:.2e} | {r['first_call_s']:.1f} |")


def markdown(rows: list[dict], meta: dict, model: str, reps: int) -> str:
    """The table of ``run``'s rows under a line saying what ``model`` ran (its sizes), the
    speed-ups against the anchors and each row's largest kernels outside GEMM and attention."""
    head = (f"{model} ({rows[0]['tokens'] if rows else '-'} image tokens); {meta['gpu']}, torch {meta['torch']}. "
            f"Step: median of {reps} CUDA-event-timed forwards after warm-up; kernel split from the profiler, "
            "GPU ms.\n\n")
    lines = ["| mode | step ms | peak GiB | GEMM / attention / other / idle ms | err vs eager | first call s |",
             "|---|---|---|---|---|---|"] + [_row_line(r) for r in rows]
    by = {r["mode"]: r["step_ms"] for r in rows}
    pairs = [("ours", "eager"), ("ours", "compile"), ("ours+compile", "compile"), ("ours+cudagraph", "compile"),
             ("ours-fp8", "torchao-fp8+compile"), ("ours-fp8+compile", "torchao-fp8+compile"),
             ("ours", "ours+ropetables"), ("ours-fp8", "ours-fp8+ropetables"),
             ("ours", "ours+attnsdpa"), ("ours-fp8", "ours-fp8+attnsdpa")]
    speedups = [f"{a} vs {b} {by[b] / by[a]:.2f}x" for a, b in pairs if a in by and b in by]
    others = harness.other_kernels_markdown(rows, lambda r: r["mode"])
    return (head + "\n".join(lines) + "\n\nSpeed-ups: " + "; ".join(speedups)
            + "\n\n" + others)


def add_run_arguments(parser: argparse.ArgumentParser, extra_modes: tuple[str, ...] = ()) -> None:
    """The arguments of ``run`` and the report, shared by the image-model benchmarks
    (``extra_modes``: a benchmark's own, beside MODES, not run by default)."""
    parser.add_argument("--modes", nargs="+", default=MODES, choices=MODES + SDPA_MODES + list(extra_modes))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json")
    parser.add_argument("--markdown")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.flux_e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="dev", choices=sorted(CONFIGS))
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--text-tokens", type=int, default=512)
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the FLUX end-to-end benchmark")
    meta = dict(harness.device_meta(None), config=args.config)
    modes = available_modes(args.modes)

    def fresh():
        return random_transformer(args.config, torch.bfloat16, "cuda")

    def inputs(model):
        return step_inputs(model, args.height, args.width, args.text_tokens, "cuda")

    rows = run(fresh, inputs, modes, args.reps)
    title = (f"FLUX.1-{args.config} transformer, random weights, bf16, batch 1, {args.text_tokens} text tokens, "
             f"{args.height}x{args.width}")
    harness.write_report(markdown(rows, meta, title, args.reps), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""End-to-end LTX-Video benchmark: one transformer step and a short denoising loop.

    python -m ltx_kernels.bench.ltx_e2e --frames 49 161 --json e2e.json --markdown e2e.md
    python -m ltx_kernels.bench.ltx_e2e --plot e2e.json e2e.png     # bar chart from the JSON

Full-size random weights (``--config 2b|13b``), bf16, CFG batch 2, 128 text tokens, 512x768,
the setup of benchmarks/results/h100/ltx_e2e.md. Modes, run one after another on the same model:
stock eager, stock + torch.compile (``compile_repeated_blocks(fullgraph=True)``), ours
(``ltx_kernels.diffusers.inject``), ours + torch.compile, ours replayed from a CUDA graph
(``ltx_kernels.cuda_graph.capture``), ours with our exact attention kernel (``inject(attention="bf16")``: the ``ltx_kernels`` diffusers attention
backend instead of SDPA) and with our 8-bit attention (``inject(attention="8bit")``: the
``ltx_kernels_8bit`` backend), alone and with torch.compile; then, each on a fresh copy of the
same random weights (quantizing is one-way): ours in FP8 (``inject(precision="fp8")``), alone,
with torch.compile and in a CUDA graph, ours in FP8 with our exact or 8-bit attention, alone and
with torch.compile, and the anchor torchao FP8
(``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``) + torch.compile, skipped
with a message when torchao is not installed.
Per mode: median step time over ``--reps`` CUDA-event-timed steps after warm-up, peak memory,
the kernel-time split from the profiler (GEMM / attention / everything else: the attention
column is the attention share of the step, its 8-bit quantization passes included), the step's
output error against stock eager, and the time of a ``--loop-steps`` denoising loop through
LTXPipeline (scheduler and CFG included).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ltx_kernels import cuda_graph
from ltx_kernels.bench import harness, ltx_models

MODES = ["eager", "compile", "ours", "ours+compile", "ours+cudagraph", "ours+attnsdpa", "ours+attnbf16",
         "ours+attn8bit", "ours+attn8bit+compile", "ours-fp8", "ours-fp8+compile", "ours-fp8+cudagraph",
         "ours-fp8+attnsdpa", "ours-fp8+attnbf16", "ours-fp8+attnbf16+compile", "ours-fp8+attnbf16+cudagraph",
         "ours-fp8+attn8bit", "ours-fp8+attn8bit+compile", "ours-fp8+attn8bit+cudagraph", "torchao-fp8+compile"]
# ours with diffusers' RoPE tables (inject(rope="stock")) instead of the in-kernel angles, for
# the LTX benchmarks (LTX-Video's and LTX-2's video RoPE), to compare the two in one run.
ROPE_TABLE_MODES = ["ours+ropetables", "ours-fp8+ropetables"]
# Modes that change the weights (FP8 quantization): each runs on a fresh copy of the model.
QUANTIZED = ("ours-fp8", "ours-fp8+compile", "ours-fp8+cudagraph", "ours-fp8+attnsdpa", "ours-fp8+attnbf16",
             "ours-fp8+attnbf16+compile", "ours-fp8+attnbf16+cudagraph", "ours-fp8+attn8bit",
             "ours-fp8+attn8bit+compile", "ours-fp8+attn8bit+cudagraph", "ours-fp8+ropetables", "torchao-fp8+compile")


def _torchao_fp8(model) -> None:
    """torchao's FP8 recipe on the model's bf16 linears: its per-row scaling takes bf16 weights
    only, and diffusers keeps some linears in fp32 (Wan's time embedder), which stay as they are."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
              filter_fn=lambda module, _: isinstance(module, torch.nn.Linear) and module.weight.dtype == torch.bfloat16)


def set_mode(model, mode: str) -> None:
    """Puts a diffusers transformer in ``mode`` (one of MODES, without '+cudagraph'): stock
    again (our patches removed, its repeated blocks uncompiled), then ours / torchao / compile.
    Shared with the FLUX benchmark."""
    import ltx_kernels.diffusers as lkd

    if mode not in QUANTIZED:
        lkd.remove(model)
        for module in model.modules():
            module._compiled_call_impl = None
    torch._dynamo.reset()
    attention = "8bit" if "+attn8bit" in mode else "bf16" if "+attnbf16" in mode else None
    rope = "stock" if "+ropetables" in mode else "exact"
    if mode.startswith("ours-fp8"):
        lkd.inject(model, precision="fp8", attention=attention, rope=rope)
    elif mode.startswith("ours"):
        lkd.inject(model, attention=attention, rope=rope)
    elif mode.startswith("torchao"):
        _torchao_fp8(model)
    if "+attnsdpa" in mode:
        # A chosen backend, diffusers' native SDPA: what attention=None gives where our kernel
        # is not the faster, measured where it is (_diffusers_attention.prefers_ours).
        model.set_attention_backend("native")
    if mode.endswith("compile"):
        compile_blocks(model)


def compile_blocks(model) -> None:
    """torch.compile (fullgraph) of the model's repeated blocks, the anchor's recipe: diffusers'
    ``compile_repeated_blocks`` where the class declares them, else each module of the class of
    ``transformer_blocks``' first (PixArt and DiT declare none)."""
    if getattr(model, "_repeated_blocks", None):
        model.compile_repeated_blocks(fullgraph=True)
        return
    block_class = type(model.transformer_blocks[0])
    for module in model.modules():
        if type(module) is block_class:
            module.compile(fullgraph=True)


def available_modes(modes: list[str]) -> list[str]:
    """``modes`` without the torchao anchors when torchao is not installed (said on stderr)."""
    try:
        import torchao  # noqa: F401
    except ImportError:
        skipped = [m for m in modes if m.startswith("torchao")]
        if skipped:
            print(f"torchao is not installed: skipping {', '.join(skipped)}", file=sys.stderr)
        return [m for m in modes if m not in skipped]
    return modes


def measure_step(forward, mode: str, reps: int, reference, row: dict):
    """Times one transformer step ``forward()`` (it returns the output) in ``mode`` into
    ``row``: the first call (for '+cudagraph' modes, ltx_kernels.cuda_graph's recording), warm-up,
    the error against ``reference`` (this output when None), the median step time, peak memory and
    the kernel split. Returns the reference. Shared with the FLUX benchmark."""
    t0 = time.perf_counter()
    out = forward()
    torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - t0
    for _ in range(3):
        out = forward()
    if reference is None:
        reference = out.float().clone()
    row["err_vs_eager"] = harness.rel_err(out, reference)
    torch.cuda.reset_peak_memory_stats()
    row["step_ms"] = harness.time_ms(forward, reps)
    row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    row["kernels_ms"] = harness.kernel_split_ms(forward)
    return reference


def each_mode(stock, fresh, modes):
    """Yields ``(mode, model)`` for each mode, the model set to it: ``fresh()``, another copy of
    the weights, for the quantized modes, else ``stock`` (None when only quantized modes run, so
    that their peak memory is their own). The caller drops its reference to the model before
    asking for the next: memory is then freed between modes; ``stock`` ends in eager mode."""
    for mode in modes:
        model = fresh() if mode in QUANTIZED else stock
        set_mode(model, mode.removesuffix("+cudagraph"))
        if mode.endswith("+cudagraph"):  # the forward replayed from a CUDA graph, as a user gets it
            cuda_graph.capture(model)
        yield mode, model
        cuda_graph.release(model)
        del model
        harness.release_memory()
    if stock is not None:
        set_mode(stock, "eager")


def run_frames(stock, fresh, frames: int, height: int, width: int, modes, reps: int, loop_steps: int) -> list[dict]:
    """One row per mode (models as :func:`each_mode` gives them)."""
    reference = None
    rows = []
    for mode, model in each_mode(stock, fresh, modes):
        # Seeded: every mode gets the same inputs.
        kw = ltx_models.step_inputs(model, batch=2, num_frames=frames, height=height, width=width)
        embeds = ltx_models.prompt_embeds(model, batch=1)
        pipe = ltx_models.random_pipeline(model)
        pipe.set_progress_bar_config(disable=True)
        row = {"frames": frames, "tokens": kw["hidden_states"].shape[1], "mode": mode}
        with torch.no_grad():
            reference = measure_step(lambda: model(**kw)[0], mode, reps, reference, row)
            if loop_steps and not mode.endswith("+cudagraph"):
                g = torch.Generator(device="cuda")

                def loop():
                    pipe(**embeds, num_frames=frames, height=height, width=width, num_inference_steps=loop_steps,
                         guidance_scale=3.0, output_type="latent", generator=g.manual_seed(0))

                loop()  # warm-up: the pipeline's first call sets up its scheduler and masks
                row["loop_ms"] = harness.time_ms(loop, 2)
        rows.append(row)
        print(_row_line(row), flush=True)
        del model, pipe
    return rows


def _row_line(r: dict) -> str:
    loop = f"{r['loop_ms']:.0f}" if "loop_ms" in r else "-"
    return (f"| {r['frames']}f S={r['tokens']} | {r['mode']} | {r['step_ms']:.1f} | {loop} | "
            f"{r['peak_mem_gib']:.2f} | {harness.split_text(r['kernels_ms'])} | "
            f"{r['err_vs_eager']:.2e} | {r['first_call_s']:.1f} |")


def markdown(rows: list[dict], meta: dict, args) -> str:
    head = (f"LTX-Video {args.config} transformer, random weights, bf16, CFG batch 2, 128 text tokens, "
            f"{args.height}x{args.width}; {meta['gpu']}, torch {meta['torch']}. Step: median of {args.reps} "
            f"CUDA-event-timed forwards after warm-up; loop: {args.loop_steps} steps of LTXPipeline "
            "(CFG, scheduler). Kernel split from the profiler, GPU ms.\n\n")
    lines = ["| video | mode | step ms | loop ms | peak GiB | GEMM / attention / other / idle ms | err vs eager | "
             "first call s |", "|---|---|---|---|---|---|---|---|"]
    lines += [_row_line(r) for r in rows]
    speedups = []
    for frames in sorted({r["frames"] for r in rows}):
        by = {r["mode"]: r["step_ms"] for r in rows if r["frames"] == frames}
        pairs = [("ours", "eager"), ("ours", "compile"), ("ours+compile", "compile"), ("ours+cudagraph", "compile"),
                 ("ours", "ours+attnsdpa"), ("ours-fp8", "ours-fp8+attnsdpa"),
                 ("ours+attnbf16", "ours"), ("ours+attn8bit", "ours"), ("ours+attn8bit+compile", "ours+compile"),
                 ("ours-fp8", "torchao-fp8+compile"), ("ours-fp8+compile", "torchao-fp8+compile"),
                 ("ours-fp8+cudagraph", "torchao-fp8+compile"), ("ours-fp8+attnbf16", "ours-fp8"),
                 ("ours-fp8+attnbf16", "torchao-fp8+compile"), ("ours-fp8+attnbf16+compile", "torchao-fp8+compile"),
                 ("ours-fp8+attnbf16+cudagraph", "torchao-fp8+compile"),
                 ("ours-fp8+attnbf16+cudagraph", "ours-fp8+attnbf16"),
                 ("ours-fp8+attn8bit", "ours-fp8"),
                 ("ours-fp8+attn8bit+compile", "ours-fp8+compile"),
                 ("ours-fp8+attn8bit+cudagraph", "ours-fp8+cudagraph"),
                 ("ours-fp8+attn8bit+cudagraph", "torchao-fp8+compile")]
        speedups += [f"{frames}f: {a} vs {b} {by[b] / by[a]:.2f}x" for a, b in pairs if a in by and b in by]
    others = harness.other_kernels_markdown(rows, lambda r: f"{r['frames']}f {r['mode']}")
    return (head + "\n".join(lines) + "\n\nSpeed-ups: " + "; ".join(speedups)
            + "\n\n" + others)


def plot(json_path: str, png_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(json_path))
    rows = data["results"]
    frames = sorted({r["frames"] for r in rows})
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(frames), figsize=(5.5 * len(frames), 4), squeeze=False)
    for ax, f in zip(axes[0], frames):
        by = {r["mode"]: r for r in rows if r["frames"] == f}
        xs = [m for m in modes if m in by]
        colors = ["#999", "#666", "#4a8", "#287", "#165", "#6b9", "#3a7", "#48c", "#26a", "#148", "#7ad", "#59c",
                  "#c84"]
        # (colours repeat past the palette: MODES outnumbers it)
        ax.bar(xs, [by[m]["step_ms"] for m in xs], color=[colors[MODES.index(m) % len(colors)] for m in xs])
        for i, m in enumerate(xs):
            ax.text(i, by[m]["step_ms"], f"{by[m]['step_ms']:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{f} frames (S = {by[xs[0]]['tokens']})")
        ax.set_ylabel("ms per transformer step")
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(f"LTX-Video {data['meta'].get('config', '')} one step, {data['meta']['gpu']}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.ltx_e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="2b", choices=["2b", "13b", "tiny"])
    parser.add_argument("--frames", type=int, nargs="+", default=[49, 161])
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--modes", nargs="+", default=MODES, choices=MODES + ROPE_TABLE_MODES)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--loop-steps", type=int, default=8, help="denoising loop length (0: no loop)")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="only draw the bar chart of a JSON")
    args = parser.parse_args(argv)
    if args.plot:
        plot(*args.plot)
        return 0
    if not torch.cuda.is_available():
        return harness.no_cuda("the end-to-end benchmark")
    meta = dict(harness.device_meta(None), config=args.config)
    modes = available_modes(args.modes)

    def fresh():
        return ltx_models.random_transformer(args.config, torch.bfloat16, "cuda")

    model = fresh() if any(m not in QUANTIZED for m in modes) else None
    rows = []
    for frames in args.frames:
        rows += run_frames(model, fresh, frames, args.height, args.width, modes, args.reps, args.loop_steps)
    harness.write_report(markdown(rows, meta, args), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

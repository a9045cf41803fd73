"""End-to-end LTX-Video denoising loop with a cache method: do our kernels stack with it?

    python -m ltx_kernels.bench.ltx_cache --frames 161 --json cache.json --markdown cache.md

LTXPipeline's denoising loop (``--steps`` 30, CFG batch 2, 128 text tokens, 512x768, its
scheduler; random full-size weights, bf16, no text encoder or VAE) with diffusers'
``FirstBlockCache(threshold=0.1)``, in one run, on one model: stock + cache, ours + cache
(``ltx_kernels.diffusers.inject``), ours + cache + torch.compile
(``compile_repeated_blocks``, not fullgraph: the cache decides on the host, each step,
whether the remaining blocks run); ``--modes`` adds stock + cache + compile and ours in
FP8 (``inject(precision="fp8")``, one-way: on a fresh copy of the same random weights).
Per mode: the loop's wall time (median of ``--reps`` loops after ``--warmup`` loops, which
compile: the first one the graphs of a full evaluation, the second those of the calls the
cache cut short, and more), how many of the loop's transformer calls were full evaluations
(the cache decided to run the remaining blocks: its other calls run the first block only),
peak memory (an FP8 mode's includes the bf16 model kept for the others), and the final
latents' error against stock + cache. The times compare one to one only when every mode
did the same number of full evaluations: the output says whether they did. The speed-up
target (issue 23) is ours + cache <= 0.70x stock + cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from ltx_kernels.bench import harness, ltx_models

MODES = ["stock+fbc", "ours+fbc", "ours+fbc+compile", "stock+fbc+compile", "ours-fp8+fbc", "ours-fp8+fbc+compile"]
DEFAULT_MODES = MODES[:3]
BASELINE = "stock+fbc"


class EvaluationCounter:
    """Counts FirstBlockCache's decisions on ``model``: each transformer call runs the first
    block, then the cache decides whether the remaining blocks run (a full evaluation) or
    its cached residual stands in for them. Wraps that decision (a host-side call, outside
    any compiled graph) on the head block's hook instance."""

    def __init__(self, model) -> None:
        from diffusers.hooks.first_block_cache import _FBC_LEADER_BLOCK_HOOK

        hook = model.transformer_blocks[0]._diffusers_hook.get_hook(_FBC_LEADER_BLOCK_HOOK)
        decide = hook._should_compute_remaining_blocks
        self.calls = self.full = 0

        @torch.compiler.disable
        def counted(residual):
            full = decide(residual)
            self.calls += 1
            self.full += bool(full)
            return full

        hook._should_compute_remaining_blocks = counted

    def reset(self) -> None:
        self.calls = self.full = 0


def set_mode(model, mode: str, threshold: float, backend: str) -> EvaluationCounter:
    """``model`` (stock, no cache) as ``mode`` wants it; returns the cache's counter."""
    import ltx_kernels.diffusers as lkd
    from diffusers import FirstBlockCacheConfig

    torch._dynamo.reset()
    if mode.startswith("ours"):
        lkd.inject(model, precision="fp8" if mode.startswith("ours-fp8") else "bf16")
    model.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    if mode.endswith("+compile"):
        model.compile_repeated_blocks(fullgraph=False, backend=backend)
    return EvaluationCounter(model)


def reset_mode(model) -> None:
    """Stock again, without cache or compiled blocks."""
    import ltx_kernels.diffusers as lkd

    model.disable_cache()
    lkd.remove(model)
    for block in model.transformer_blocks:
        block._compiled_call_impl = None
    torch._dynamo.reset()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _compiled_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def run_mode(model, mode: str, args, device: torch.device) -> dict:
    """Times ``args.reps`` denoising loops of ``mode`` after ``args.warmup`` loops; leaves
    ``model`` stock, but for FP8 (one-way), which leaves it quantized."""
    pipe = ltx_models.random_pipeline(model)
    pipe.set_progress_bar_config(disable=True)
    embeds = ltx_models.prompt_embeds(model, batch=1)
    counter = set_mode(model, mode, args.threshold, args.compile_backend)

    def loop():
        model._reset_stateful_cache()  # a pipeline call does not: every loop starts afresh
        counter.reset()
        g = torch.Generator(device=device).manual_seed(0)
        return pipe(**embeds, num_frames=args.frames, height=args.height, width=args.width,
                    num_inference_steps=args.steps, guidance_scale=3.0, output_type="latent",
                    generator=g).frames

    row = {"mode": mode, "frames": args.frames, "steps": args.steps, "threshold": args.threshold}
    with torch.no_grad():
        t0 = time.perf_counter()
        loop()
        _sync(device)
        row["first_loop_s"] = time.perf_counter() - t0  # compile included
        for _ in range(args.warmup - 1):
            loop()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times, evaluations = [], set()
        graphs = _compiled_graphs()
        for _ in range(args.reps):
            _sync(device)
            t0 = time.perf_counter()
            latents = loop()
            _sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
            evaluations.add((counter.full, counter.calls))
        row["graphs_compiled_while_timed"] = _compiled_graphs() - graphs  # a recompile in a timed loop
    if "fp8" not in mode:
        reset_mode(model)
    (row["full_evaluations"], row["transformer_calls"]), *others = sorted(evaluations)
    row["evaluations_vary"] = bool(others)  # the cache decided differently from one loop to the next
    row["loop_ms"] = statistics.median(times)
    row["loop_ms_all"] = times
    row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    row["latents"] = latents.float().cpu()
    return row


def summary(rows: list[dict]) -> list[str]:
    """Lines on the evaluation counts and the speed-ups against stock + cache."""
    by = {r["mode"]: r for r in rows}
    counts = {r["mode"]: r["full_evaluations"] for r in rows}
    lines = []
    if len(set(counts.values())) == 1 and not any(r["evaluations_vary"] for r in rows):
        row = rows[0]
        lines.append(f"Every mode did the same {row['full_evaluations']} full transformer evaluations of "
                     f"{row['transformer_calls']} calls: the times compare one to one.")
    else:
        listed = ", ".join(f"{m} {n}" + (" (varied between loops)" if by[m]["evaluations_vary"] else "")
                           for m, n in counts.items())
        lines.append(f"WARNING: the modes did DIFFERENT numbers of full transformer evaluations ({listed}): the "
                     "cache decided differently, so the times do not compare one to one.")
    recompiled = [r["mode"] for r in rows if r["graphs_compiled_while_timed"]]
    if recompiled:
        lines.append(f"WARNING: {', '.join(recompiled)} compiled graphs during the timed loops: raise --warmup.")
    if BASELINE in by:
        base = by[BASELINE]["loop_ms"]
        for mode in by:
            if mode != BASELINE:
                lines.append(f"{mode} / {BASELINE}: {by[mode]['loop_ms'] / base:.3f}x wall time of the loop "
                             f"({base / by[mode]['loop_ms']:.2f}x faster; target for ours + cache: <= 0.70x)")
    return lines


def markdown(rows: list[dict], meta: dict, args) -> str:
    head = (f"LTX-Video {args.config} transformer, random weights, {args.dtype}, LTXPipeline loop of {args.steps} "
            f"steps (CFG batch 2, 128 text tokens), {args.frames} frames {args.height}x{args.width}, "
            f"FirstBlockCache(threshold={args.threshold}); {meta['device']}, torch {meta['torch']}. Loop: wall time, "
            f"median of {args.reps} after {args.warmup} warm-up loops; compile: compile_repeated_blocks(backend="
            f"{args.compile_backend!r}). Full evaluations: calls where the cache ran the remaining blocks.\n\n")
    lines = ["| mode | loop ms | full evaluations / calls | peak GiB | latents err vs stock+fbc | first loop s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        peak = "-" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.2f}"
        lines.append(f"| {r['mode']} | {r['loop_ms']:.0f} | {r['full_evaluations']} / {r['transformer_calls']} | "
                     f"{peak} | {r['err_vs_stock_fbc']:.2e} | {r['first_loop_s']:.1f} |")
    return head + "\n".join(lines) + "\n\n" + "\n".join(summary(rows)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.ltx_cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="2b", choices=sorted(ltx_models.CONFIGS))
    parser.add_argument("--frames", type=int, default=161)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threshold", type=float, default=0.1, help="FirstBlockCache threshold")
    parser.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=MODES)
    parser.add_argument("--reps", type=int, default=3, help="timed loops per mode")
    parser.add_argument("--warmup", type=int, default=2, help="untimed loops first (they compile)")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--allow-cpu", action="store_true", help="run a full-size config on the CPU (slow)")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu" and args.config != "tiny" and not args.allow_cpu:
        print(f"the {args.config} config on the CPU takes hours: use --config tiny, a CUDA device, or --allow-cpu",
              file=sys.stderr)
        return 2
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    meta = (dict(harness.device_meta(None), device=torch.cuda.get_device_name(device)) if device.type == "cuda"
            else {"device": "cpu", "torch": torch.__version__})
    meta.update(config=args.config, dtype=args.dtype)

    model = ltx_models.random_transformer(args.config, dtype, device)
    rows = []
    for mode in [BASELINE] + [m for m in args.modes if m != BASELINE]:
        # FP8 quantizes the weights: a fresh copy of the same random weights (the same seed).
        fp8 = ltx_models.random_transformer(args.config, dtype, device) if "fp8" in mode else None
        row = run_mode(model if fp8 is None else fp8, mode, args, device)
        del fp8
        row["err_vs_stock_fbc"] = harness.rel_err(row["latents"], rows[0]["latents"] if rows else row["latents"])
        rows.append(row)
        print(f"{mode}: loop {row['loop_ms']:.0f} ms, {row['full_evaluations']} of {row['transformer_calls']} calls "
              f"full evaluations", flush=True)
    for row in rows:
        del row["latents"]
    harness.write_report(markdown(rows, meta, args), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

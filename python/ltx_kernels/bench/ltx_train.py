"""LTX-Video LoRA training step benchmark (issue 22 item 4).

    python -m ltx_kernels.bench.ltx_train --frames 49 --json train.json --markdown train.md

One optimizer step of LoRA fine-tuning, as diffusers' training scripts run it: the transformer
(``--config 2b|13b``, random weights, frozen, bf16) with peft LoRA adapters (``add_adapter``: bf16
like the base, rank ``--rank``, alpha = rank) on the attention projections (to_q, to_k, to_v,
to_out.0, self- and cross-attention) and the feed-forward's linears (ff.net.0.proj, ff.net.2);
one forward on the random latents, timestep and 128-token text embeddings of a denoising step
(batch 1: no CFG in training), an MSE loss against a random target, backward, AdamW over the
adapters, ``zero_grad(set_to_none=True)``. ``--checkpointing`` turns on diffusers' gradient
checkpointing.
Modes, each on a fresh copy of the same weights, adapters and inputs: stock eager, stock +
torch.compile (``compile_repeated_blocks(fullgraph=True)``, as ltx_e2e), ours
(``ltx_kernels.diffusers.inject``), ours + torch.compile.
Per mode: median step time over ``--reps`` CUDA-event-timed steps after warm-up, peak memory,
the first step's time and loss, and that loss's relative difference from eager's. Targets
(issue 22): ours >= 1.5x eager, ours+compile >= 1.10x compile. A mode that raises is reported
with its error and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from ltx_kernels.bench import harness, ltx_models
from ltx_kernels.bench.ltx_e2e import compile_blocks

MODES = ["eager", "compile", "ours", "ours+compile"]
LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]
SPEEDUP_TARGETS = [("ours", "eager", 1.5), ("ours+compile", "compile", 1.10)]  # issue 22


def lora_training(mode: str, config: str, dtype: torch.dtype, device, frames: int, height: int, width: int,
                  rank: int, checkpointing: bool = False):
    """A fresh LoRA model of ``config`` in ``mode`` and its training step: returns
    ``(model, step)``; ``step()`` runs one optimizer step on the same batch and returns the loss
    (detached, not synchronized). Weights, adapters, inputs and target are seeded: the same in
    every mode."""
    from peft import LoraConfig

    import ltx_kernels.diffusers as lkd

    torch._dynamo.reset()  # the last mode's graphs go with its model
    model = ltx_models.random_transformer(config, dtype, device).train()
    if mode.startswith("ours"):
        lkd.inject(model)  # before the adapters: the order test_training holds to stock's gradients
    torch.manual_seed(1)
    # init_lora_weights=False: B nonzero (peft's default starts it at zero), so that the first
    # step's loss runs through the adapters and checks them; the compute is the same.
    model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=LORA_TARGETS, init_lora_weights=False))
    if checkpointing:
        model.enable_gradient_checkpointing()
    if mode.endswith("compile"):
        compile_blocks(model)
    kw = ltx_models.step_inputs(model, batch=1, num_frames=frames, height=height, width=width)
    g = torch.Generator().manual_seed(2)
    batch, tokens, _ = kw["hidden_states"].shape
    target = torch.randn(batch, tokens, model.config.out_channels, generator=g).to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step():
        loss = F.mse_loss(model(**kw)[0].float(), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return model, step


def measure(mode: str, args, row: dict) -> None:
    """Builds ``mode``'s model and times its step into ``row`` (CUDA)."""
    _, step = lora_training(mode, args.config, torch.bfloat16, "cuda", args.frames, args.height, args.width,
                            args.rank, args.checkpointing)
    t0 = time.perf_counter()
    row["first_loss"] = step().item()  # the fresh weights' loss, comparable across modes
    row["first_step_s"] = time.perf_counter() - t0
    for _ in range(2):  # warm-up, beside the first step's compilation and AdamW state
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    row["step_ms"] = harness.time_ms(step, args.reps)
    row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30


def run(args) -> list[dict]:
    rows = []
    for mode in args.modes:
        row = {"mode": mode}
        try:
            measure(mode, args, row)
        except Exception as exc:  # reported in its row; the other modes still run
            row = {"mode": mode, "error": f"{type(exc).__name__}: {exc}"}
        harness.release_memory()  # measure's model and optimizer are gone with its frame
        rows.append(row)
    eager = next((r["first_loss"] for r in rows if r["mode"] == "eager" and "error" not in r), None)
    for r in rows:
        if eager is not None and "error" not in r:
            r["loss_vs_eager"] = abs(r["first_loss"] - eager) / abs(eager)
        print(_row_line(r), flush=True)
    return rows


def _row_line(r: dict) -> str:
    if "error" in r:
        return f"| {r['mode']} | failed: {r['error'][:300]} | | | | |"
    diff = f"{r['loss_vs_eager']:.2e}" if "loss_vs_eager" in r else "-"
    return (f"| {r['mode']} | {r['step_ms']:.1f} | {r['peak_mem_gib']:.2f} | {r['first_loss']:.6f} | {diff} | "
            f"{r['first_step_s']:.1f} |")


def speedups(rows: list[dict]) -> list[str]:
    by = {r["mode"]: r["step_ms"] for r in rows if "error" not in r}
    return [f"{a} vs {b} {by[b] / by[a]:.2f}x (target >= {t:.2f}x: {'met' if by[b] / by[a] >= t else 'MISSED'})"
            for a, b, t in SPEEDUP_TARGETS if a in by and b in by]


def markdown(rows: list[dict], meta: dict, args) -> str:
    tokens = ltx_models.latent_grid(args.frames, args.height, args.width)
    head = (f"LTX-Video {args.config} LoRA training step (rank {args.rank}, alpha {args.rank}, attention and "
            f"feed-forward linears), random frozen bf16 weights, batch 1, {args.frames} frames "
            f"{args.height}x{args.width} (S = {tokens[0] * tokens[1] * tokens[2]}), 128 text tokens, gradient "
            f"checkpointing {'on' if args.checkpointing else 'off'}; {meta['gpu']}, torch {meta['torch']}. Step "
            f"(forward, MSE loss, backward, AdamW, zero_grad): median of {args.reps} CUDA-event-timed steps "
            "after warm-up; loss of the first step, relative difference from eager's.\n\n")
    lines = ["| mode | step ms | peak GiB | first-step loss | loss vs eager | first step s |",
             "|---|---|---|---|---|---|"] + [_row_line(r) for r in rows]
    return head + "\n".join(lines) + "\n\nSpeed-ups: " + "; ".join(speedups(rows)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.ltx_train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="2b", choices=["2b", "13b", "tiny"])
    parser.add_argument("--frames", type=int, default=49)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    parser.add_argument("--checkpointing", action="store_true", help="diffusers' gradient checkpointing")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the LoRA training benchmark")
    meta = dict(harness.device_meta(None), config=args.config, frames=args.frames, height=args.height,
                width=args.width, rank=args.rank, checkpointing=args.checkpointing)
    rows = run(args)
    print()
    harness.write_report(markdown(rows, meta, args), meta, rows, args.json, args.markdown)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""LLM training-step benchmark: one step of an 8B-class decoder, stock vs Liger-Kernel vs ours.

    python -m ltx_kernels.bench.llm_train --layers 4 --seq 4096 --batch 2 --json train.json --markdown train.md

Llama-3-8B dimensions (:data:`ltx_kernels.bench.llm_e2e.LLAMA3_8B`), ``--layers`` decoder layers,
random bf16 weights, sdpa attention. A step: forward with labels -> loss, backward, AdamW
(fused on CUDA), ``zero_grad(set_to_none=True)``, on ``--batch`` x ``--seq`` random token ids
and labels. Modes, each on a fresh model with the same weights and the same batch: stock eager,
stock + ``torch.compile(fullgraph=True)``, Liger-Kernel (``apply_liger_kernel_to_llama(model=...)``:
RMSNorm, SwiGLU, RoPE, fused linear + cross-entropy; left out when it is not installed), ours
(``ltx_kernels.transformers.apply``: its norms, MLP, RoPE and fused linear + cross-entropy
loss), ours + compile.

Per mode: the median of ``--reps`` CUDA-event-timed steps after warm-up, the peak memory over
them, and the first step's loss with its difference from eager's (the same weights and batch:
only rounding may differ). A mode that raises is reported with its error and the others still
run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time

import torch

from ltx_kernels.bench import harness, llm_e2e

MODES = ["eager", "compile", "liger", "ours", "ours+compile"]
WARMUP = 3  # steps before timing, the first included: compilation, AdamW's lazily built state
LR = 1e-5  # a fine-tuning rate; the step costs the same at any
# (mode, baseline, issue 22's target speed-up)
SPEEDUPS = [("compile", "eager", None), ("liger", "eager", None), ("ours", "eager", None),
            ("ours", "liger", 1.10), ("ours+compile", "compile", 1.05)]


def _liger_version() -> str | None:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


def random_batch(vocab: int, batch: int, seq: int, device="cuda") -> dict:
    generator = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, vocab, (2, batch, seq), device=device, generator=generator)
    return dict(input_ids=ids[0], labels=ids[1])


def setup(mode: str, model):
    """(forward, optimizer) of ``mode`` for a fresh ``model``, which is patched in place."""
    model.train()
    if mode == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(model=model)
    elif mode.startswith("ours"):
        import ltx_kernels.transformers as lt

        lt.apply(model)
    forward = torch.compile(model, fullgraph=True) if mode.endswith("compile") else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=model.device.type == "cuda")
    return forward, optimizer


def train_step(forward, optimizer, batch: dict) -> torch.Tensor:
    loss = forward(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _measure(mode: str, build, batch: dict, reps: int) -> dict:
    forward, optimizer = setup(mode, build())
    t0 = time.perf_counter()
    row = {"loss": train_step(forward, optimizer, batch).item()}  # .item() waits for the step
    row["first_step_s"] = time.perf_counter() - t0
    for _ in range(WARMUP - 1):
        train_step(forward, optimizer, batch)
    torch.cuda.synchronize()
    # Reset after warm-up: the peak is a steady step's (weights, AdamW state, gradients,
    # activations), not compilation's one-off buffers.
    torch.cuda.reset_peak_memory_stats()
    row["ms"] = harness.time_ms(lambda: train_step(forward, optimizer, batch), reps)
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def run(modes, build, batch: dict, reps: int) -> list[dict]:
    """One row per mode; ``build()`` returns a fresh model with the same weights each call."""
    from transformers.models.llama import modeling_llama

    tokens = batch["input_ids"].numel()
    rows, eager_loss = [], None
    for mode in modes:
        row = {"mode": mode}
        # Liger patches modeling_llama itself even when given a model (RoPE is a module
        # global; the norm and MLP classes are swapped): restored so later modes run stock.
        saved = dict(vars(modeling_llama))
        try:
            row.update(_measure(mode, build, batch, reps))
            row["tokens_per_s"] = tokens / row["ms"] * 1e3
        except Exception as error:  # reported; the other modes still run
            row["error"] = f"{type(error).__name__}: {error}"
        vars(modeling_llama).update(saved)
        torch._dynamo.reset()
        harness.release_memory()
        if mode == "eager":
            eager_loss = row.get("loss")
        if "loss" in row and eager_loss is not None:
            row["loss_vs_eager"] = row["loss"] - eager_loss
        rows.append(row)
        print(_row_line(row), flush=True)
    return rows


def _row_line(r: dict) -> str:
    if "error" in r:
        error = r["error"].splitlines()[0][:300].replace("|", "/")  # one table cell
        return f"| {r['mode']} | failed: {error} | | | | | |"
    diff = f"{r['loss_vs_eager']:+.2e}" if "loss_vs_eager" in r else "-"
    return (f"| {r['mode']} | {r['ms']:.1f} | {r['tokens_per_s']:.0f} | {r['peak_gib']:.2f} | {r['loss']:.5f} | "
            f"{diff} | {r['first_step_s']:.1f} |")


def summary(rows: list[dict]) -> str:
    """Speed-ups of the pairs that both ran, against issue 22's targets, and ours' peak vs Liger's."""
    ms = {r["mode"]: r["ms"] for r in rows if "ms" in r}
    parts = []
    for mode, base, target in SPEEDUPS:
        if mode in ms and base in ms:
            goal = f" (target >= {target:.2f}x)" if target else ""
            parts.append(f"{mode} vs {base} {ms[base] / ms[mode]:.2f}x{goal}")
    peak = {r["mode"]: r["peak_gib"] for r in rows if "peak_gib" in r}
    if "ours" in peak and "liger" in peak:
        parts.append(f"peak memory ours {peak['ours']:.2f} GiB vs liger {peak['liger']:.2f} GiB (target <=)")
    return "; ".join(parts)


def markdown(rows: list[dict], meta: dict, args) -> str:
    head = (f"Llama-3-8B dimensions, {args.layers} decoder layers, random bf16 weights, sdpa. One training step "
            f"on {args.batch} x {args.seq} random tokens and labels: forward -> loss, backward, fused AdamW, "
            f"zero_grad(set_to_none=True). {meta['gpu']}, torch {meta['torch']}, transformers "
            f"{meta['transformers']}, liger-kernel {meta['liger_kernel'] or 'not installed'}. Median of {args.reps} "
            f"CUDA-event-timed steps after {WARMUP} warm-up steps; peak = torch.cuda.max_memory_allocated over the "
            "timed steps; first-step loss from the same weights and batch in every mode.\n\n")
    lines = ["| mode | ms | tokens/s | peak GiB | first-step loss | vs eager | first step s |",
             "|---|---|---|---|---|---|---|"]
    lines += [_row_line(r) for r in rows]
    return head + "\n".join(lines) + "\n\nSpeed-ups: " + summary(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.llm_train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the LLM training-step benchmark")
    import transformers

    liger = _liger_version()
    if "liger" in args.modes and liger is None:
        print("Liger-Kernel is not installed: no liger mode", file=sys.stderr)
    # In MODES' order: eager first, the anchor of every other mode's loss difference.
    modes = [m for m in MODES if m in args.modes and (m != "liger" or liger)]
    meta = dict(harness.device_meta(None), transformers=transformers.__version__, liger_kernel=liger,
                layers=args.layers, seq=args.seq, batch=args.batch)
    batch = random_batch(llm_e2e.LLAMA3_8B["vocab_size"], args.batch, args.seq)
    rows = run(modes, lambda: llm_e2e.random_model("llama3-8b", args.layers), batch, args.reps)
    harness.write_report(markdown(rows, meta, args), meta, rows, args.json, args.markdown)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

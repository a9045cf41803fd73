"""An LLM head's loss, forward + backward: ``python -m ltx_kernels.bench.cross_entropy``.

    python -m ltx_kernels.bench.cross_entropy --json ce.json --markdown ce.md

``cross_entropy(x @ weight.T, target)`` (mean over the tokens) and the gradients of x and
weight, bf16, at LLM head shapes (tokens x hidden -> vocabulary), per mode: eager as
transformers computes it (bf16 logits, upcast to fp32 for the loss), torch.compile of that,
Liger-Kernel's fused linear cross-entropy (left out when it is not installed) and ours
(:func:`ltx_kernels.fused_linear_cross_entropy`). Per mode: the median of CUDA-event-timed
steps, the peak memory above the inputs (the logits and their gradient are where the modes
differ), and the loss and gradients' relative L2 distance to an fp32 computation.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import ltx_kernels
from ltx_kernels.bench import harness

MODES = ["eager", "compile", "liger", "ours"]
# (label, tokens, hidden, vocabulary): Llama-3-8B's and Qwen2-7B's heads at 8192 tokens, and a
# small held-out one.
SHAPES = [("Llama-3-8B", 8192, 4096, 128256), ("Qwen2-7B", 8192, 3584, 152064), ("held-out", 1000, 2048, 32000)]


def eager(x, weight, target):
    return F.cross_entropy(F.linear(x, weight).float(), target)


def loss_fns() -> dict:
    """The modes' loss functions of (x, weight, target); Liger's only when it is installed."""
    fns = {"eager": eager, "compile": torch.compile(eager), "ours": ltx_kernels.fused_linear_cross_entropy}
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError:
        print("Liger-Kernel is not installed: no liger row", file=sys.stderr)
    else:
        fns["liger"] = liger_fused_linear_cross_entropy
    return {m: fns[m] for m in MODES if m in fns}


def inputs(tokens: int, hidden: int, vocab: int, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, device=device, generator=g).bfloat16()
    weight = (torch.randn(vocab, hidden, device=device, generator=g) / hidden**0.5).bfloat16()
    target = torch.randint(0, vocab, (tokens,), device=device, generator=g)
    return x, weight, target


def step(fn, x, weight, target):
    """One forward + backward: the loss and the gradients of x and weight."""
    x, weight = (t.detach().requires_grad_() for t in (x, weight))
    loss = fn(x, weight, target)
    loss.backward()
    return loss.detach(), x.grad, weight.grad


def measure(fn, x, weight, target, reference, reps: int) -> dict:
    loss, gx, gw = step(fn, x, weight, target)
    row = {"loss_err": abs(loss.item() - reference[0].item()) / abs(reference[0].item()),
           "grad_x_err": harness.rel_err(gx, reference[1]), "grad_w_err": harness.rel_err(gw, reference[2])}
    del loss, gx, gw
    step(fn, x, weight, target)  # warm-up (compilation happened in the first)
    harness.release_memory()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    row["ms"] = harness.time_ms(lambda: step(fn, x, weight, target), reps)
    row["peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    return row


def run(shapes, reps: int) -> list[dict]:
    fns = loss_fns()
    rows = []
    for label, tokens, hidden, vocab in shapes:
        x, weight, target = inputs(tokens, hidden, vocab)
        reference = step(eager, x.float(), weight.float(), target)
        for mode, fn in fns.items():
            row = {"shape": label, "tokens": tokens, "hidden": hidden, "vocab": vocab, "mode": mode}
            try:
                row.update(measure(fn, x, weight, target, reference, reps))
            except Exception as error:  # reported; the other modes still run
                row["error"] = f"{type(error).__name__}: {error}"
            harness.release_memory()
            rows.append(row)
            print(_row_line(row), flush=True)
        del x, weight, target, reference
        torch._dynamo.reset()
        harness.release_memory()
    return rows


def _row_line(r: dict) -> str:
    shape = f"{r['shape']} ({r['tokens']} x {r['hidden']} -> {r['vocab']})"
    if "error" in r:
        return f"| {shape} | {r['mode']} | failed: {r['error']} | | | |"
    return (f"| {shape} | {r['mode']} | {r['ms']:.2f} | {r['peak_gib']:.2f} | {r['loss_err']:.1e} | "
            f"{r['grad_x_err']:.1e} / {r['grad_w_err']:.1e} |")


def speedups(rows: list[dict]) -> list[str]:
    """Ours against each other mode, per shape."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        by = {r["mode"]: r["ms"] for r in rows if r["shape"] == shape and "error" not in r}
        if "ours" in by:
            out += [f"{shape}: ours vs {m} {by[m] / by['ours']:.2f}x" for m in by if m != "ours"]
    return out


def markdown(rows: list[dict], meta: dict) -> str:
    head = (f"LLM head loss, forward + backward (x @ weight.T -> cross-entropy, mean; gradients of x and "
            f"weight), bf16, random inputs; {meta['gpu']}, torch {meta['torch']}. ms: median of CUDA-event-"
            "timed steps; peak: memory allocated above the inputs; errors: relative to the same computation "
            "in fp32.\n\n")
    lines = ["| shape (tokens x hidden -> vocab) | mode | ms | peak GiB | loss err | grad x / weight err |",
             "|---|---|---|---|---|---|"] + [_row_line(r) for r in rows]
    return head + "\n".join(lines) + "\n\nSpeed-ups: " + "; ".join(speedups(rows)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.cross_entropy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the LLM head loss benchmark")
    meta = harness.device_meta(None)
    rows = run(SHAPES, args.reps)
    print()
    harness.write_report(markdown(rows, meta), meta, rows, args.json, args.markdown)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

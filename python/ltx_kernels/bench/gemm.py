"""FP8 linear benchmark: ``python -m ltx_kernels.bench.gemm --json gemm.json --markdown gemm.md``.

At the LTX-Video 2B linear shapes (tokens x in -> out, CFG batch 2 at 49 and 161 frames) and
held-out ones, side by side in one run: the bf16 GEMM (``torch.nn.functional.linear``, cuBLAS),
``torch._scaled_mm`` with row-wise e4m3 scales and fast accumulation on pre-quantized operands
(cuBLASLt as torchao's per-row FP8 runs it: its default ``Float8MMConfig(use_fast_accum=True)``),
ours ``fp8_linear`` on pre-quantized operands, ours from a bf16 input (``quantize_fp8`` + GEMM,
what a patched linear runs), and ``quantize_fp8`` alone with its share
of copy bandwidth. TFLOPS count 2*M*N*K over the time of that column (the quantization
included where it runs); error is the relative L2 distance to the fp32 product. The gated
residual columns time ``residual + gate * linear(x)`` on pre-quantized operands (one sample,
one gate row): ``_scaled_mm`` then our ``gated_residual``, against ours written by the GEMM's
epilogue (``fp8_linear_gated_residual``, what a DiT block's output and down projections run);
the same in 16 bits: cuBLAS's ``linear`` then ``gated_residual`` against ours
(``linear_gated_residual``, what they run in the model's dtype).
"""

from __future__ import annotations

import argparse
import sys

import torch

from ltx_kernels.bench import harness

# (label, M tokens, K in, N out)
SHAPES = [
    ("ltx161f ff-up", 16128, 2048, 8192),
    ("ltx161f ff-down", 16128, 8192, 2048),
    ("ltx161f qkvo", 16128, 2048, 2048),
    ("ltx49f ff-up", 5376, 2048, 8192),
    ("ltx49f ff-down", 5376, 8192, 2048),
    ("ltx49f qkvo", 5376, 2048, 2048),
    # LTX-2 19B, 121 frames 768x512, CFG batch 2: 2 x 6144 video tokens, D 4096 (audio 2048)
    ("ltx2 ff-up", 12288, 4096, 16384),
    ("ltx2 ff-down", 12288, 16384, 4096),
    ("ltx2 qkvo", 12288, 4096, 4096),
    ("ltx2 video->audio", 12288, 4096, 2048),
    # FLUX.1-dev 1024^2, 4096 image + 512 text tokens: the image stream's q/k/v/out and FF, the
    # single block's input projections and output projection (3.3 waves of tiles; ours splits it
    # at the attention / MLP boundary), the text stream's FF down projection (under one wave)
    ("flux img qkvo", 4096, 3072, 3072),
    ("flux img ff-up", 4096, 3072, 12288),
    ("flux img ff-down", 4096, 12288, 3072),
    ("flux single mlp-in", 4608, 3072, 12288),
    ("flux single out", 4608, 15360, 3072),
    ("flux single out, MLP part", 4608, 12288, 3072),
    ("flux single out, attention part", 4608, 3072, 3072),
    ("flux text ff-down", 512, 12288, 3072),
    ("held-out 1000x3072x3072", 1000, 3072, 3072),
    ("held-out 4096x4096x14336", 4096, 4096, 14336),
    ("held-out 333x5120x1536", 333, 5120, 1536),
]


def run_shape(label: str, m: int, k: int, n: int, copy_gbs: float) -> dict:
    import ltx_kernels

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    reference = torch.nn.functional.linear(x.float(), w.float(), bias.float())
    qx, sx = ltx_kernels.quantize_fp8(x)
    qw, sw = ltx_kernels.quantize_fp8(w)
    residual = torch.randn(1, m, n, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(1, 1, n, device="cuda", dtype=torch.bfloat16)
    runs = {
        "bf16": lambda: torch.nn.functional.linear(x, w, bias),
        "scaled_mm": lambda: torch._scaled_mm(qx, qw.t(), sx[:, None], sw[None, :], bias=bias,
                                              out_dtype=torch.bfloat16, use_fast_accum=True),
        "ours": lambda: ltx_kernels.fp8_linear(qx, qw, sw, bias, x_scale=sx),
        "ours+quantize": lambda: ltx_kernels.fp8_linear(x, qw, sw, bias),
        "scaled_mm+residual": lambda: ltx_kernels.gated_residual(
            residual, torch._scaled_mm(qx, qw.t(), sx[:, None], sw[None, :], bias=bias,
                                       out_dtype=torch.bfloat16, use_fast_accum=True)[None], gate),
        "ours_residual": lambda: ltx_kernels.fp8_linear_gated_residual(qx[None], sx[None], qw, sw, bias, residual, gate),
        "bf16+residual": lambda: ltx_kernels.gated_residual(residual, torch.nn.functional.linear(x, w, bias)[None], gate),
        "bf16_residual": lambda: ltx_kernels.linear_gated_residual(x[None], w, bias, residual, gate),
    }
    gated_reference = residual.float() + gate.float() * reference[None]
    row = {"shape": label, "m": m, "k": k, "n": n}
    for name, fn in runs.items():
        us = harness.bench_us(fn)
        row[f"{name}_us"] = us
        row[f"{name}_tflops"] = 2.0 * m * n * k / us / 1e6
        row[f"{name}_err"] = harness.rel_err(fn(), gated_reference if "residual" in name else reference)
    us = harness.bench_us(lambda: ltx_kernels.quantize_fp8(x))
    row["quantize_us"] = us
    row["quantize_pct_copy"] = 100.0 * (m * k * 3 + m * 4) / (us * 1e-6) / 1e9 / copy_gbs
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    head = (f"{meta['gpu']}, torch {meta['torch']}; copy {meta['copy_gbs']:.0f} GB/s. TFLOPS = 2MNK / median GPU "
            "time (L2 flushed); error vs the fp32 product. scaled_mm and ours take pre-quantized operands; "
            "ours+quantize includes quantize_fp8 of the bf16 input.\n\n")
    lines = ["| shape (M x K -> N) | bf16 | scaled_mm fp8, fast accum | ours fp8 | ours + quantize | scaled_mm + gated_residual | "
             "ours, residual in the epilogue | bf16 + gated_residual | ours bf16, residual in the epilogue | "
             "quantize_fp8 us (% copy) | err bf16 / fp8 / ours bf16 residual |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    columns = ("bf16", "scaled_mm", "ours", "ours+quantize", "scaled_mm+residual", "ours_residual", "bf16+residual",
               "bf16_residual")
    for r in rows:
        cells = [f"{r[f'{c}_tflops']:.0f} ({r[f'{c}_us']:.0f} us)" for c in columns]
        lines.append(f"| {r['shape']} ({r['m']} x {r['k']} -> {r['n']}) | " + " | ".join(cells)
                     + f" | {r['quantize_us']:.1f} ({r['quantize_pct_copy']:.0f}%) | "
                     f"{r['bf16_err']:.1e} / {r['ours+quantize_err']:.1e} / {r['bf16_residual_err']:.1e} |")
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.gemm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the GEMM benchmark")
    copy_gbs = harness.copy_bandwidth_gbs()
    meta = harness.device_meta(copy_gbs)
    rows = [run_shape(*shape, copy_gbs) for shape in SHAPES]
    harness.write_report(markdown(rows, meta), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

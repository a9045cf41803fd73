"""Micro-benchmark: ``python -m ltx_kernels.bench`` (or ``ltx-kernels bench``).

Times every op against PyTorch eager, torch.compile of the same eager code and Liger-Kernel
(when installed) at the shapes of LTX-Video 2B, an 8B LLM and small row counts, prints a
markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import sys

import torch

from ltx_kernels.bench import adaln, elementwise, group_norm, harness, norm, rope

# (label, rows, hidden): LTX-2B at 49 and 161 frames with CFG, an 8B-class LLM prefill,
# and latency-bound small batches (decode, a single image).
SHAPES = [
    ("ltx49f 5376x2048", 5376, 2048),
    ("ltx161f 16128x2048", 16128, 2048),
    ("llm 8192x4096", 8192, 4096),
    ("small 1x4096", 1, 4096),
    ("small 8x4096", 8, 4096),
    ("small 64x2048", 64, 2048),
]
IMPLS = ["ltx_kernels", "eager", "compile", "liger"]
# --held-out: sizes nothing was tuned to, for the norm family: every D x rows, in bf16
# (contiguous and with a row stride > D) and fp16.
HELD_OUT_D = (1536, 2560, 3072, 4096, 5120)
HELD_OUT_ROWS = (1, 7, 64, 1000, 5376, 16128, 65536)
HELD_OUT_VARIANTS = (("bf16", torch.bfloat16, False), ("bf16 strided", torch.bfloat16, True),
                     ("fp16", torch.float16, False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ltx-kernels bench", description=__doc__)
    parser.add_argument("--json", help="write results to this JSON file")
    parser.add_argument("--markdown", help="write the table to this markdown file")
    parser.add_argument("--ops", nargs="*", help="only these ops (default: all)")
    parser.add_argument("--shapes", nargs="*", help="only shapes whose label starts with these")
    parser.add_argument("--held-out", action="store_true",
                        help="the norm family at held-out sizes (D x rows, strided, fp16) instead of the listed shapes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("ltx-kernels bench")

    copy_gbs = harness.copy_bandwidth_gbs()
    meta = harness.device_meta(copy_gbs)
    print(f"{meta['gpu']}: device-to-device copy {copy_gbs:.0f} GB/s (read + write)")
    if args.held_out:
        cases = [c for tag, dtype, strided in HELD_OUT_VARIANTS
                 for c in norm.cases([(f"{rows}x{d} {tag}", rows, d) for d in HELD_OUT_D for rows in HELD_OUT_ROWS],
                                     dtype, strided)]
    else:
        shapes = [s for s in SHAPES if not args.shapes or any(s[0].startswith(p) for p in args.shapes)]
        ltx_shapes = [s for s in shapes if s[0].startswith("ltx")]
        llm_shapes = [s for s in shapes if s[0].startswith("llm")]
        cases = (norm.cases(shapes) + adaln.cases(ltx_shapes) + elementwise.cases(ltx_shapes, llm_shapes)
                 + rope.ltx_cases(ltx_shapes) + rope.llm_cases(llm_shapes)
                 + [c for c in group_norm.cases() if not args.shapes or any(c.shape.startswith(p) for p in args.shapes)])
    if args.ops:
        cases = [c for c in cases if c.op in args.ops]
    if args.held_out and args.shapes:
        cases = [c for c in cases if any(c.shape.startswith(p) for p in args.shapes)]
    results = harness.run_cases(cases, copy_gbs)
    dtypes = "bf16 and fp16 as labelled" if args.held_out else "bf16"
    harness.write_ops_report(results, IMPLS, meta, copy_gbs, f"{dtypes}, us (% of copy bandwidth): median GPU time, "
                             "L2 flushed, host launch overhead excluded.", args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

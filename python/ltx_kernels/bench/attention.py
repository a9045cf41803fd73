"""Attention benchmark: ``ltx-kernels bench attention [--json F] [--markdown F]``
(or ``python -m ltx_kernels.bench.attention``).

Non-causal forward at LTX-Video / FLUX shapes and held-out ones, side
by side in one run: SDPA's flash and cuDNN backends, FlashAttention-3 (the ``fa3-fwd`` wheel)
in bf16 and in FP8 with per-(batch, head) scales, SageAttention (``sageattention``), and ours
in bf16 and 8-bit. FA3 and SageAttention are optional: absent, their columns say so. TFLOPS
count 4*B*H*Sq*Sk*D over the median GPU time; ours 8-bit includes its quantization pass, FA3
FP8 does not (its inputs are quantized outside the timed call, as FA3 users do). Errors are
the relative L2 distance to fp32 attention on randn inputs and on the "outlier" inputs of the
attention issue (K with per-channel offsets of ~4 sigma, hot channels).
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ltx_kernels.bench import harness

# (label, B, H, Sq, Sk, D, key padding mask)
SHAPES = [
    ("LTX-2B 49f", 2, 32, 2688, 2688, 64, False),
    ("LTX-2B 161f", 2, 32, 8064, 8064, 64, False),
    ("LTX 13B 161f", 2, 32, 8064, 8064, 128, False),
    ("FLUX 1024x1024", 1, 24, 4608, 4608, 128, False),
    ("LTX-2B 257f 768x1280", 1, 32, 31680, 31680, 64, False),
    ("held-out", 4, 16, 1000, 1000, 128, False),
    ("held-out odd length", 1, 8, 3333, 3333, 64, False),
    ("LTX-2B 161f cross-attn, text 128 padded", 2, 32, 8064, 128, 64, True),
    # short videos / low resolutions, around where our kernel overtakes cuDNN at head dim 64 (1536 tokens:
    # where inject() with no attention backend routes to it; attention.md)
    ("short 1024", 2, 32, 1024, 1024, 64, False),
    ("short 1536", 2, 32, 1536, 1536, 64, False),
    # SD3.5 at 1024x1024: the joint attention (4096 image + 333 text tokens, head dim 64) that the
    # default routing sends to our kernel
    ("SD3.5 1024x1024 joint", 2, 38, 4429, 4429, 64, False),
]
IMPLS = ["sdpa_flash", "sdpa_cudnn", "fa3_bf16", "fa3_fp8", "sage", "ours_bf16", "ours_8bit"]


def inputs(b, h, sq, sk, d, outlier: bool, seed: int = 0, device="cuda"):
    """bf16 q, k, v [B, H, S, D]: randn, or the issue's outlier inputs."""
    g = torch.Generator(device=device).manual_seed(seed)
    n = lambda *shape: torch.randn(*shape, device=device, generator=g)  # noqa: E731
    if not outlier:
        return tuple(n(b, h, s, d).bfloat16() for s in (sq, sk, sk))
    hot = torch.ones(d, device=device)
    hot[: max(d // 32, 1)] = 8.0
    c_k, c_v = n(1, h, 1, d), n(1, h, 1, d)
    return ((hot * n(b, h, sq, d)).bfloat16(), (0.5 * hot * (n(b, h, sk, d) + 4 * c_k)).bfloat16(),
            (n(b, h, sk, d) + 2 * c_v).bfloat16())


def padding_mask(b, sk):
    """Key padding as LTX's cross-attention has it: batch i keeps the first sk - 37 i keys."""
    keep = torch.arange(sk, device="cuda")[None, :] < torch.tensor([sk - 37 * i for i in range(b)], device="cuda")[:, None]
    return keep[:, None, None, :]


def sdpa(backend: SDPBackend):
    def run(q, k, v, mask):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return run


def fa3_runners() -> dict[str, Callable] | str:
    try:
        from fa3_fwd_interface import flash_attn_func
    except ImportError as error:
        return f"fa3-fwd not installed ({error.name})"

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    def bf16(q, k, v, mask):
        return first(flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))).transpose(1, 2)

    def prepare_fp8(q, k, v):
        """e4m3 [B, S, H, D] copies with one descale per (batch, head): quantized outside the timing."""
        def quantize(x):
            scale = x.float().abs().amax(dim=(2, 3)).clamp(min=1e-12) / 448.0  # [B, H]
            return (x.float() / scale[:, :, None, None]).to(torch.float8_e4m3fn).transpose(1, 2).contiguous(), scale
        (q8, qs), (k8, ks), (v8, vs) = quantize(q), quantize(k), quantize(v)
        return lambda: first(flash_attn_func(q8, k8, v8, q_descale=qs, k_descale=ks, v_descale=vs)).transpose(1, 2)

    return {"fa3_bf16": bf16, "fa3_fp8": prepare_fp8}


def sage_runner() -> Callable | str:
    try:
        from sageattention import sageattn
    except ImportError as error:
        return f"sageattention not installed ({error.name})"
    return lambda q, k, v, mask: sageattn(q, k, v, tensor_layout="HND", is_causal=False)


def runners(q, k, v, mask) -> dict[str, Callable | str]:
    """impl -> a no-argument call on these inputs, or why it cannot run them."""
    import ltx_kernels

    out: dict[str, Callable | str] = {
        "sdpa_flash": "no attn_mask support" if mask is not None else lambda: sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v, None),
        "sdpa_cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION)(q, k, v, mask),
        "ours_bf16": lambda: ltx_kernels.attention(q, k, v, attn_mask=mask),
        "ours_8bit": lambda: ltx_kernels.attention(q, k, v, attn_mask=mask, precision="8bit"),
    }
    fa3 = fa3_runners()
    sage = sage_runner()
    if mask is not None:
        fa3 = sage = "no attn_mask support"
    if isinstance(fa3, str):
        out["fa3_bf16"] = out["fa3_fp8"] = fa3
    else:
        out["fa3_bf16"] = lambda: fa3["fa3_bf16"](q, k, v, None)
        out["fa3_fp8"] = fa3["fa3_fp8"](q, k, v)
    out["sage"] = sage if isinstance(sage, str) else (lambda: sage(q, k, v, None))
    return out


def reference(q, k, v, mask):
    """fp32 attention (SDPA's memory-efficient backend: fp32 math, no S x S matrix)."""
    additive = None if mask is None else torch.where(mask, 0.0, float("-inf"))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=additive)


def run_shape(label, b, h, sq, sk, d, masked) -> dict:
    row = {"shape": label, "b": b, "h": h, "sq": sq, "sk": sk, "d": d, "masked": masked}
    flops = 4.0 * b * h * sq * sk * d
    mask = padding_mask(b, sk) if masked else None
    for kind in ("randn", "outlier"):
        q, k, v = inputs(b, h, sq, sk, d, outlier=kind == "outlier")
        ref = reference(q, k, v, mask)
        for name, fn in runners(q, k, v, mask).items():
            if isinstance(fn, str):
                row[f"{name}_skip"] = fn
                continue
            try:
                row[f"{name}_err_{kind}"] = harness.rel_err(fn(), ref)
                if kind == "randn":
                    us = harness.bench_us(fn, reps=20)
                    row[f"{name}_us"] = us
                    row[f"{name}_tflops"] = flops / us / 1e6
            except RuntimeError as error:  # e.g. a backend that refuses this shape
                row[f"{name}_skip"] = str(error).splitlines()[0][:120]
        del q, k, v, ref
        harness.release_memory()
    return row


def cell(r: dict, name: str) -> str:
    if f"{name}_tflops" not in r:
        return "—"
    return f"{r[f'{name}_tflops']:.0f} ({r[f'{name}_err_randn']:.1e} / {r[f'{name}_err_outlier']:.1e})"


def markdown(rows: list[dict], meta: dict) -> str:
    skipped = sorted({r[k] for r in rows for k in r if k.endswith("_skip")})
    head = (f"{meta['gpu']}, torch {meta['torch']}. TFLOPS = 4*B*H*Sq*Sk*D / median GPU time (L2 flushed); "
            "in brackets the relative L2 error vs fp32 attention on randn / outlier inputs. Ours 8-bit includes its "
            "quantization pass; FA3 FP8 takes inputs quantized beforehand (per batch and head).\n\n")
    lines = ["| shape (B, H, Sq, Sk, D) | " + " | ".join(IMPLS) + " |", "|---" * (len(IMPLS) + 1) + "|"]
    for r in rows:
        lines.append(f"| {r['shape']} ({r['b']}, {r['h']}, {r['sq']}, {r['sk']}, {r['d']}) | "
                     + " | ".join(cell(r, name) for name in IMPLS) + " |")
    notes = "\n\n" + "\n".join(f"- not run: {s}" for s in skipped) if skipped else ""
    return head + "\n".join(lines) + notes + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ltx-kernels bench attention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--shapes", nargs="*", help="only shapes whose label starts with these")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the attention benchmark")
    meta = harness.device_meta(harness.copy_bandwidth_gbs())
    shapes = [s for s in SHAPES if not args.shapes or any(s[0].startswith(p) for p in args.shapes)]
    rows = []
    for shape in shapes:
        rows.append(run_shape(*shape))
        print(f"{shape[0]}: " + ", ".join(f"{n} {cell(rows[-1], n)}" for n in IMPLS), flush=True)
    harness.write_report(markdown(rows, meta), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What each 8-bit P V format would cost the 8-bit attention in accuracy, emulated in plain
torch on the CPU: ``python -m ltx_kernels.bench.attention_emulation [--keys ...] [--markdown F]``.

The scores are those of ``ltx_kernels.attention(precision="8bit")``'s method (SageAttention's):
q and k rounded to INT8 with one scale per 64-token block of a head, k minus its mean over the
keys first (softmax ignores a per-row constant); their integer products are exact, so the
emulation computes them in fp64. The softmax is the kernel's online one, over steps of 128 keys:
P = exp(s - running max) in fp32, where the running max moves only when a step's max passes it
by more than a slack (0: FlashAttention's exact running max; the kernel's lazy rescaling: 8, in
log2 units), so P <= 2**slack; the row sum l is of the unrounded P in fp32, as FlashAttention
keeps it. Then P V in the format under test, and the relative L2 distance of the output to fp64
attention, on randn and on the attention issue's outlier inputs
(:func:`ltx_kernels.bench.attention.inputs`). P V formats, P / V:

- ``bf16``: 16-bit P and V (what the kernel runs today);
- ``e4m3``: P / 2**slack * 256 in e4m3 (FlashAttention-3 FP8's range); V minus its per-channel
  mean over the keys in e4m3 with one scale per channel (the mean added back after the division
  by l);
- ``u8`` / ``s8``: P / 2**slack * 255 rounded to uint8; V minus its mean rounded to int8 with one
  scale per channel (u8 x s8 products summed in int32 are exact: Hopper's wgmma has the shape).

The kernel's own roundings beyond these (its fp32 sums, exp2 approximations) are not modelled.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from ltx_kernels.bench.attention import inputs

BLOCK = 64  # tokens per INT8 scale, as the kernel's
P_FORMATS = ("bf16", "e4m3", "u8")
V_FORMATS = ("bf16", "e4m3", "s8")
COMBOS = [("bf16", "bf16"), ("e4m3", "bf16"), ("bf16", "e4m3"), ("e4m3", "e4m3"), ("u8", "bf16"), ("bf16", "s8"),
          ("u8", "s8")]


def _int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, D] rounded to INT8 with one scale per BLOCK tokens of a head, dequantized
    (fp64)."""
    b, h, s, d = x.shape
    pad = (-s) % BLOCK
    blocks = torch.nn.functional.pad(x, (0, 0, 0, pad)).view(b, h, -1, BLOCK, d)
    scale = blocks.abs().amax(dim=(-1, -2), keepdim=True).clamp_min(1e-12) / 127
    return (torch.round(blocks / scale).clamp(-127, 127) * scale).view(b, h, -1, d)[:, :, :s]


def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The 8-bit method's scores s = q k^T / sqrt(D), fp32."""
    q, k = q.double(), k.double()
    k = k - k.mean(dim=-2, keepdim=True)
    return (_int8_blocks(q) @ _int8_blocks(k).transpose(-1, -2) / q.shape[-1] ** 0.5).float()


def _round_p(p: torch.Tensor, fmt: str, slack: float) -> torch.Tensor:
    """P (<= 2**slack) in ``fmt``, as the values the P V product multiplies (fp64)."""
    if fmt == "bf16":
        return p.bfloat16().double()
    unit = 2.0**slack  # P / unit is in [0, 1]
    if fmt == "e4m3":
        return (p / unit * 256).to(torch.float8_e4m3fn).double() / 256 * unit
    return torch.round(p.double() / unit * 255) / 255 * unit  # u8


def _round_v(v: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(rounded V or V minus its channel mean, the mean to add back: 0 for bf16)."""
    v = v.double()
    if fmt == "bf16":
        return v, torch.zeros_like(v[..., :1, :])
    mean = v.mean(dim=-2, keepdim=True)
    centred = v - mean
    amax = centred.abs().amax(dim=-2, keepdim=True).clamp_min(1e-12)
    if fmt == "e4m3":
        scale = amax / 448
        return (centred / scale).to(torch.float8_e4m3fn).double() * scale, mean
    scale = amax / 127  # s8
    return torch.round(centred / scale).clamp(-127, 127) * scale, mean


def errors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slack: float = 0.0,
           block: int = 128) -> dict[tuple[str, str], float]:
    """{(P format, V format): relative L2 error vs fp64 attention} for COMBOS, with the kernel's
    online softmax over steps of ``block`` keys: a row's running max moves only when a step's
    max passes it by more than ``slack`` (log2 units; the kernel's lazy rescaling uses 8, 0 is
    FlashAttention's exact running max), so a step's P is <= 2**slack; the output and the row sum
    l (of the unrounded P, in fp32) are rescaled when it moves."""
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v.double()
    s = scores(q, k)
    rounded = {vf: _round_v(v, vf) for vf in V_FORMATS}
    acc = {c: 0.0 for c in COMBOS}
    row_max = None
    row_sum = torch.zeros(s.shape[:-1] + (1,), dtype=torch.float32)
    for start in range(0, s.shape[-1], block):
        step = s[..., start:start + block]
        step_max = step.amax(dim=-1, keepdim=True)
        new_max = step_max if row_max is None else torch.where(
            step_max > row_max + slack * math.log(2), step_max, row_max)
        if row_max is not None:
            factor = torch.exp(row_max - new_max)
            row_sum = row_sum * factor
            acc = {c: a * factor.double() for c, a in acc.items()}
        row_max = new_max
        p = torch.exp(step - row_max)
        row_sum = row_sum + p.sum(dim=-1, keepdim=True)
        for pf, vf in COMBOS:
            acc[(pf, vf)] = acc[(pf, vf)] + _round_p(p, pf, slack) @ rounded[vf][0][..., start:start + block, :]
    out = {}
    for pf, vf in COMBOS:
        o = acc[(pf, vf)] / row_sum.double() + rounded[vf][1]
        out[(pf, vf)] = ((o - exact).norm() / exact.norm()).item()
    return out


def markdown(rows: list[dict]) -> str:
    head = " | ".join(f"P {pf} / V {vf}" for pf, vf in COMBOS)
    lines = [
        "Relative L2 error vs fp64 attention, randn / outlier inputs; scores from INT8 q, k (64-token "
        "block scales, k smoothed), an online softmax over 128-key steps whose running max moves past "
        "`slack` (log2 units), then P V in the given formats (see ltx_kernels/bench/attention_emulation.py).",
        "",
        f"| slack | keys | D | {head} |",
        "|---|---|---|" + "---|" * len(COMBOS),
    ]
    for r in rows:
        cells = " | ".join(f"{r['randn'][c]:.1e} / {r['outlier'][c]:.1e}" for c in COMBOS)
        lines.append(f"| {r['slack']:g} | {r['keys']} | {r['d']} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.attention_emulation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, nargs="+", default=[300, 1000, 4000])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--slack", type=float, nargs="+", default=[0.0, 8.0],
                        help="running-max slack in log2 units (0: exact running max; the kernel's lazy rescaling: 8)")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    rows = []
    for slack in args.slack:
        for d in args.head_dims:
            for keys in args.keys:
                row = {"slack": slack, "keys": keys, "d": d}
                for kind in ("randn", "outlier"):
                    qkv = inputs(1, args.heads, args.queries, keys, d, kind == "outlier", device="cpu")
                    row[kind] = errors(*qkv, slack=slack)
                rows.append(row)
                print(f"slack={slack} D={d} keys={keys} done", file=sys.stderr, flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared test helpers: devices, dtypes, the one tolerance table, input builders."""

import pytest
import torch

import ltx_kernels  # noqa: F401  (loads the ops)

HAS_CUDA = torch.cuda.is_available()

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")),
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# ||out - ref|| / ||ref|| allowed per output dtype, against an fp64 reference on the same
# (rounded) inputs: one rounding of the output plus fp32 accumulation.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# Element by element, beside the relative L2 check (which a few wrong elements in a large
# output pass): |out - ref| <= ELEMENT_RTOL * |ref| + TOLERANCE * rms(ref). ELEMENT_RTOL is
# two roundings of the output dtype (one of the output, one of an fp32 step); the absolute
# part, relative to the output's scale, covers elements near zero after a cancellation.
ELEMENT_RTOL = {torch.float32: 2.0**-22, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def activation_scale(dtype: torch.dtype) -> float:
    """The tolerance scale of exp-based activations (GELU, SiLU): exp(z) evaluated in fp32 for
    |z| near fp32's range (~88) inherits |z| times the rounding of z, ~1e-5 of the value (of a
    GELU of ~1e-37), which is a lone element's whole fp32 tolerance. 16-bit dtypes round far
    coarser."""
    return 4.0 if dtype == torch.float32 else 1.0


HIDDEN_SIZES = [1, 7, 111, 769, 2048, 4096, 5125, 8192, 16384]
ROW_COUNTS = [0, 1, 3, 67]

# How an input is laid out in memory: a plain tensor, rows that are a slice of a wider
# tensor, a slice starting one element in (so not 16-byte aligned), and leading dims that
# do not collapse into one row stride (the op must copy).
LAYOUTS = ["contiguous", "row_strided", "misaligned", "non_collapsible"]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; NaN or inf anywhere fails."""
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out64).all(), "non-finite values in the output"
    denom = ref64.norm().item()
    return (out64 - ref64).norm().item() / (denom if denom > 0 else 1.0)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, scale: float = 1.0,
                 magnitude: torch.Tensor | None = None):
    """out matches ref for dtype: relative L2 within TOLERANCE[dtype] * scale, and every
    element within ELEMENT_RTOL[dtype] * scale of |ref| plus TOLERANCE[dtype] * scale of the
    output's rms, so that one wrong element fails too. Where ref is a sum whose terms cancel,
    `magnitude` (the sum of the terms' absolute values, same shape) replaces |ref|: each term's
    rounding is relative to the term, not to the sum. Values below the dtype's smallest
    normal count as 0 (GPU kernels flush subnormals, as fast-math exp and division do), and
    scales below it are measured against that floor (e.g. one GELU of a very negative input):
    no dtype gets closer to such a value than its own spacing."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    rel_err(out, ref)  # the finiteness check
    floor = torch.finfo(dtype).tiny
    out64, ref64 = (t.double().cpu() for t in (out, ref))
    out64, ref64 = (torch.where(t.abs() < floor, 0.0, t) for t in (out64, ref64))
    norm = max(ref64.norm().item(), floor * max(out.numel(), 1) ** 0.5)
    err = (out64 - ref64).norm().item() / norm
    assert err <= TOLERANCE[dtype] * scale, f"relative error {err:.3g} > {TOLERANCE[dtype] * scale:.3g}"
    if out.numel() == 0:
        return
    rms = norm / out.numel() ** 0.5
    # (+ floor: a value on one side of the smallest normal and its reference on the other are
    # as close as the dtype can tell)
    size = ref64.abs() if magnitude is None else magnitude.double().cpu()
    bound = (ELEMENT_RTOL[dtype] * size + TOLERANCE[dtype] * rms) * scale + floor
    excess = (out64 - ref64).abs() - bound
    worst = int(excess.flatten().argmax())
    assert excess.flatten()[worst] <= 0, (
        f"element {[int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape)]} is "
        f"{out64.flatten()[worst].item():.6g}, "
        f"expected {ref64.flatten()[worst].item():.6g} (bound {bound.flatten()[worst].item():.3g})"
    )


def make_rows(rows: int, hidden: int, dtype, device, layout: str = "contiguous") -> torch.Tensor:
    """Fresh random normals: `rows` rows of `hidden`, laid out as asked.

    Shape [rows, hidden], except non_collapsible: [2, rows / 2, hidden] for even rows.
    """
    if layout == "contiguous":
        return torch.randn(rows, hidden, dtype=dtype, device=device)
    if layout == "row_strided":
        return torch.randn(rows, 3 * hidden + 8, dtype=dtype, device=device)[:, 8 : 8 + hidden]
    if layout == "misaligned":
        return torch.randn(rows, hidden + 1, dtype=dtype, device=device)[:, 1:]
    if layout == "non_collapsible":
        # A [S, B, D] tensor read as [B, S, D], B = 2: no single row stride.
        b = 2 if rows % 2 == 0 and rows > 0 else 1
        base = torch.randn(rows // b, b, hidden, dtype=dtype, device=device)
        return base.transpose(0, 1)
    raise ValueError(layout)


class RoundedGradient(torch.autograd.Function):
    """The identity, whose backward rounds the gradient to ``dtype``: for a formula
    differentiated in fp64, an op that stores an intermediate gradient in its dtype (d loss /
    d logits fed to the cross-entropy's GEMMs, a GELU's input gradient fed to linear_gelu_tanh's)."""

    @staticmethod
    def forward(ctx, t, dtype):
        ctx.dtype = dtype
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype).to(grad.dtype), None

"""Benchmark cases of group_norm at a UNet's shapes, with the eager code diffusers' ResNet
blocks run (GroupNorm then SiLU; the time embedding added first for norm2) as the anchor."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ltx_kernels
from ltx_kernels.bench.harness import Case, rel_err

# (label, [N, C, H, W], groups): SDXL at 1024x1024 (CFG batch 2) at its three levels, SD 1.5's
# deepest level at 512x512 (few positions, many channels), and a held-out odd map.
SHAPES = [
    ("sdxl 2x320x128x128", (2, 320, 128, 128), 32),
    ("sdxl 2x640x64x64", (2, 640, 64, 64), 32),
    ("sdxl 2x1280x32x32", (2, 1280, 32, 32), 32),
    ("sd15 2x1280x8x8", (2, 1280, 8, 8), 32),
    ("held-out 3x96x75x53", (3, 96, 75, 53), 24),
]


def eager_group_norm_silu(x, groups, weight, bias, add):
    """ResnetBlock2D: hidden_states + temb[:, :, None, None], norm2, SiLU."""
    if add is not None:
        x = x + add[:, :, None, None]
    return F.silu(F.group_norm(x, groups, weight, bias, 1e-5))


def cases(dtype=torch.bfloat16) -> list[Case]:
    """group_norm + SiLU (norm1's form) and add + group_norm + SiLU (norm2's) at each shape,
    channels first and channels last."""
    compiled = torch.compile(eager_group_norm_silu)
    out = []
    for label, shape, groups in SHAPES:
        for layout in ("nchw", "nhwc"):
            x = torch.randn(shape, device="cuda", dtype=dtype)
            if layout == "nhwc":
                x = x.contiguous(memory_format=torch.channels_last)
            w = torch.randn(shape[1], device="cuda", dtype=dtype)
            b = torch.randn(shape[1], device="cuda", dtype=dtype)
            for op, add in (("group_norm_silu", None),
                            ("add_group_norm_silu", torch.randn(shape[:2], device="cuda", dtype=dtype))):
                def ours(x=x, g=groups, w=w, b=b, add=add):
                    return ltx_kernels.group_norm(x, g, w, b, 1e-5, add=add, activation="silu")

                def eager(x=x, g=groups, w=w, b=b, add=add):
                    return eager_group_norm_silu(x, g, w, b, add)

                impls = {"ltx_kernels": ours, "eager": eager,
                         "compile": lambda x=x, g=groups, w=w, b=b, add=add: compiled(x, g, w, b, add)}
                out.append(Case(op, f"{label} {layout}", 2 * x.numel() * x.element_size(), impls,
                                lambda ours=ours, eager=eager: rel_err(ours(), eager())))
    return out

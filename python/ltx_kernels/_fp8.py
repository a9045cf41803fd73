"""The FP8 linear path of the integrations (``inject(..., precision="fp8")``).

Each chosen ``nn.Linear`` gets its weight quantized once to ``float8_e4m3fn`` with one fp32
scale per output channel (:func:`ltx_kernels.quantize_fp8`); the bf16 weight is freed. Its
forward then runs :func:`ltx_kernels.fp8_linear`: the input is quantized per token, the GEMM
accumulates in fp32 and applies both scales and the bias before one rounding. Quantizing is
one-way: the bf16 weights are gone, so the model cannot be restored (reload it instead).
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from . import ops
from ._patching import patch

# Linears that stay bf16 by default: the model's input and output projections and the
# embeddings (timestep, caption) and AdaLN tables, outside the transformer blocks, where the
# error of 8 bits is not spread over a block's residual stream and the time is negligible.
DEFAULT_FP8_SKIP = ("proj_in", "proj_out", "time_embed.*", "caption_projection.*", "*adaln*", "norm_out.*")
MARKER = "_ltx_kernels_fp8"
KIND = "nn.Linear (fp8_linear, e4m3 weights and per-token activations)"


def is_quantized(module: nn.Module) -> bool:
    return MARKER in module.__dict__


def _cuda_devices(model: nn.Module) -> set[torch.device]:
    return {p.device for p in model.parameters() if p.device.type == "cuda"}


def check_device_supports_fp8(model: nn.Module) -> None:
    """Raises before anything is changed when a parameter lives on a GPU without FP8."""
    for device in _cuda_devices(model):
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise RuntimeError(
                f"precision='fp8' needs FP8 tensor cores (compute capability >= 8.9: Ada, Hopper); "
                f"{torch.cuda.get_device_name(device)} on {device} has compute capability {major}.{minor}. "
                "Use precision='bf16'."
            )


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    bias = self.bias
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return ops.fp8_linear(x, self.weight, self.weight_scale, bias)


def _why_not(module: nn.Linear) -> str | None:
    if module.in_features % 16 or module.out_features % 16:
        return f"{module.in_features} -> {module.out_features} features, not multiples of 16 (the FP8 GEMM's)"
    if module.weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"weight in {module.weight.dtype}"
    return None


def quantize_linears(model: nn.Module, skip: tuple[str, ...], report) -> None:
    """Quantizes every plain ``nn.Linear`` of ``model`` whose qualified name matches no pattern
    of ``skip`` (fnmatch); records what it did and the weight memory in ``report``."""
    before = after = 0
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or is_quantized(module) or any(fnmatch.fnmatch(name, p) for p in skip):
            continue
        why = _why_not(module)
        if why is not None:
            report.skipped.append(f"{type(model).__name__}.{name} stays bf16 under fp8: {why}")
            continue
        weight = module.weight.detach()
        before += weight.numel() * weight.element_size()
        q, scale = ops.quantize_fp8(weight)
        module.weight = nn.Parameter(q, requires_grad=False)
        module.register_buffer("weight_scale", scale)
        after += q.numel() + scale.numel() * 4
        patch(module, _forward)
        module.__dict__[MARKER] = True
        report.patched[KIND] += 1
    if before:
        report.notes.append(
            f"{type(model).__name__}: FP8 weights {before / 2**30:.2f} GiB -> {after / 2**30:.2f} GiB (scales included); "
            "one-way: the original weights were freed, remove() raises"
        )

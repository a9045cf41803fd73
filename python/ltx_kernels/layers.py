"""``nn.Module`` layers backed by the ltx_kernels ops.

Their ``forward`` reads state the way HuggingFace modules store it: ``weight`` (absent or
``None`` for a norm without affine weight) and the epsilon as ``eps`` (diffusers, torch) or
``variance_epsilon`` (transformers). So a layer can also serve as a drop-in ``forward`` for
an existing HF module, and ``from_module`` builds one that shares the module's parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from ltx_kernels import ops


def _eps_of(module: nn.Module) -> float:
    for name in ("eps", "variance_epsilon"):
        value = getattr(module, name, None)
        if value is not None:
            return float(value)
    raise AttributeError(f"{type(module).__name__} has neither `eps` nor `variance_epsilon`")


class RMSNorm(nn.Module):
    """RMSNorm over the last dim; ``weight_offset=1.0`` is Gemma's ``(1 + weight)``."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        weight_offset: float = 0.0,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight_offset = weight_offset
        init = torch.zeros if weight_offset else torch.ones
        self.weight = (
            nn.Parameter(init(hidden_size, device=device, dtype=dtype)) if elementwise_affine else None
        )

    @classmethod
    def from_module(cls, module: nn.Module, weight_offset: float = 0.0) -> "RMSNorm":
        """A layer sharing ``module``'s weight (if any) and epsilon."""
        weight = getattr(module, "weight", None)
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.eps = _eps_of(module)
        layer.weight_offset = weight_offset
        layer.weight = weight
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(
            x,
            getattr(self, "weight", None),
            _eps_of(self),
            weight_offset=getattr(self, "weight_offset", 0.0),
        )


class LayerNorm(nn.Module):
    """LayerNorm over the last dim, with optional weight and bias."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(hidden_size, **factory)) if elementwise_affine else None
        self.bias = (
            nn.Parameter(torch.zeros(hidden_size, **factory)) if elementwise_affine and bias else None
        )

    @classmethod
    def from_module(cls, module: nn.Module) -> "LayerNorm":
        """A layer sharing ``module``'s weight, bias (if any) and epsilon."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.eps = _eps_of(module)
        layer.weight = getattr(module, "weight", None)
        layer.bias = getattr(module, "bias", None)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(
            x, getattr(self, "weight", None), getattr(self, "bias", None), _eps_of(self)
        )

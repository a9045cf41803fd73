import pytest
import torch
from torch import nn

import ltx_kernels
from conftest import DEVICES, assert_close
from test_layer_norm import layer_norm_formula
from test_rms_norm import rms_norm_formula


class HFStyleRMSNorm(nn.Module):
    """How transformers stores an RMSNorm: weight and variance_epsilon."""

    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden))
        self.variance_epsilon = 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_layer(device):
    layer = ltx_kernels.layers.RMSNorm(96, eps=1e-5, device=device)
    with torch.no_grad():
        layer.weight.normal_()
    x = torch.randn(2, 7, 96, device=device)
    assert_close(layer(x), rms_norm_formula(x, layer.weight, 1e-5), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_without_weight(device):
    layer = ltx_kernels.layers.RMSNorm(96, eps=1e-6, elementwise_affine=False)
    x = torch.randn(5, 96, device=device)
    assert layer.weight is None
    assert_close(layer(x), rms_norm_formula(x, None, 1e-6), torch.float32)


def test_rms_norm_from_hf_module_shares_weight():
    hf = HFStyleRMSNorm(48)
    layer = ltx_kernels.layers.RMSNorm.from_module(hf)
    assert layer.weight is hf.weight and layer.eps == 1e-5
    x = torch.randn(3, 48)
    assert_close(layer(x), rms_norm_formula(x, hf.weight, 1e-5), torch.float32)
    # The layer's forward also works on the HF module itself (kernel-layer style).
    assert_close(ltx_kernels.layers.RMSNorm.forward(hf, x), rms_norm_formula(x, hf.weight, 1e-5), torch.float32)


def test_gemma_style_layer():
    layer = ltx_kernels.layers.RMSNorm(32, weight_offset=1.0)
    assert torch.equal(layer.weight, torch.zeros(32))  # (1 + 0) = identity scale, like Gemma
    x = torch.randn(4, 32)
    assert_close(layer(x), rms_norm_formula(x), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_from_torch_module(device):
    ref = nn.LayerNorm(80, eps=1e-6, device=device)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    layer = ltx_kernels.layers.LayerNorm.from_module(ref)
    x = torch.randn(6, 80, device=device)
    assert_close(layer(x), layer_norm_formula(x, ref.weight, ref.bias, 1e-6), torch.float32)
    no_affine = ltx_kernels.layers.LayerNorm(80, elementwise_affine=False)
    assert_close(no_affine.to(device)(x), layer_norm_formula(x), torch.float32)

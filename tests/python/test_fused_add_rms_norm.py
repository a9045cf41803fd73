import pytest
import torch

import ltx_kernels
from conftest import DEVICES, DTYPES, HIDDEN_SIZES, LAYOUTS, ROW_COUNTS, assert_close, make_rows
from test_rms_norm import rms_norm_formula


def rounded_sum(x, residual):
    """x + residual computed in fp32 and rounded once to the input dtype."""
    return (x.float() + residual.float()).to(x.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_matches_formula(device, dtype, hidden, rows):
    x = make_rows(rows, hidden, dtype, device)
    residual = make_rows(rows, hidden, dtype, device)
    weight = torch.randn(hidden, dtype=dtype, device=device)
    out, new_residual = ltx_kernels.fused_add_rms_norm(x, residual, weight, 1e-6)
    h = rounded_sum(x, residual)
    assert torch.equal(new_residual, h)
    # The norm is of the stored (rounded) sum, as in a decoder layer.
    assert_close(out, rms_norm_formula(h, weight), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("hidden", [8, 111, 4096])
def test_in_place_updates_residual(device, dtype, layout, hidden):
    x = make_rows(34, hidden, dtype, device, layout)
    residual = make_rows(34, hidden, dtype, device, layout)
    expected_residual = rounded_sum(x, residual)
    weight = torch.randn(hidden, dtype=dtype, device=device)
    out = ltx_kernels.fused_add_rms_norm_(x, residual, weight, 1e-6)
    assert torch.equal(residual, expected_residual)
    assert_close(out, rms_norm_formula(expected_residual, weight), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_no_weight_and_legacy_name(device):
    x, residual = torch.randn(2, 3, 40, device=device), torch.randn(2, 3, 40, device=device)
    out, new_residual = ltx_kernels.rmsnorm_residual(x, residual, None, 1e-6)
    assert torch.equal(new_residual, x + residual)
    assert_close(out, rms_norm_formula(x + residual), torch.float32)

"""Every tensor argument's layout is checked, not only the first one's: a second input with a
strided or expanded last dim is refused with an error naming it (the kernels read rows of
adjacent elements; such views used to give wrong values or read out of bounds), a second
input broadcast over rows (stride 0 in a leading dim) is read correctly, and a written
tensor (in place, ``out=``) may neither overlap itself nor the inputs it is computed from."""

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, assert_close

ROWS, D = 3, 64


def two_input_ops():
    """(name, op(x, second), formula(x, second)) for each op reading a second [rows, D] tensor."""
    silu, gelu = torch.nn.functional.silu, torch.nn.functional.gelu
    weight = torch.linspace(0.5, 1.5, D)
    return [
        ("silu_and_mul", ltx_kernels.silu_and_mul, lambda a, b: silu(a) * b),
        ("gelu_and_mul", ltx_kernels.gelu_and_mul, lambda a, b: gelu(a) * b),
        ("gelu_tanh_and_mul", ltx_kernels.gelu_tanh_and_mul, lambda a, b: gelu(a, approximate="tanh") * b),
        ("gated_residual", ltx_kernels.gated_residual, lambda x, y: x + y),
        ("fused_add_rms_norm", lambda x, r: ltx_kernels.fused_add_rms_norm(x, r, weight.to(x), 1e-6)[0],
         lambda x, r: torch.nn.functional.rms_norm(x + r, (D,), weight.to(x), 1e-6)),
    ]


OPS = two_input_ops()
SECOND_NAME = {"silu_and_mul": "b", "gelu_and_mul": "b", "gelu_tanh_and_mul": "b", "gated_residual": "y",
               "fused_add_rms_norm": "residual"}


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("name, op, formula", OPS, ids=[o[0] for o in OPS])
@pytest.mark.parametrize("view", ["stride_2", "expanded_last_dim"])
def test_second_input_needs_a_contiguous_last_dim(device, name, op, formula, view):
    x = torch.randn(ROWS, D, device=device)
    second = torch.randn(ROWS, 2 * D, device=device)[:, ::2] if view == "stride_2" else \
        torch.randn(ROWS, 1, device=device).expand(ROWS, D)
    with pytest.raises(ValueError, match=f"{SECOND_NAME[name]} must have a contiguous last dim"):
        op(x, second)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, op, formula", OPS, ids=[o[0] for o in OPS])
def test_second_input_broadcast_over_rows_is_read_correctly(device, name, op, formula):
    x = torch.randn(ROWS, D, device=device)
    second = torch.randn(1, D, device=device).expand(ROWS, D)  # row stride 0: read-only is fine
    assert_close(op(x, second), formula(x.double(), second.double()), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_residual_may_not_overlap_itself_or_x(device):
    x = torch.randn(ROWS, D, device=device)
    with pytest.raises(ValueError, match="fused_add_rms_norm_: residual is written, but some of its elements "
                                         "share memory"):
        ltx_kernels.fused_add_rms_norm_(x, torch.randn(1, D, device=device).expand(ROWS, D))
    buffer = torch.randn(ROWS + 1, D, device=device)
    with pytest.raises(ValueError, match="fused_add_rms_norm_: residual is written while x is read"):
        ltx_kernels.fused_add_rms_norm_(buffer[1:], buffer[:-1])
    with pytest.raises(ValueError, match="residual is written while x is read"):
        ltx_kernels.fused_add_rms_norm_(buffer, buffer)
    # Disjoint halves of one buffer are fine, and the in-place result is the out-of-place one.
    residual, expected_residual = buffer[2:], buffer[2:] + buffer[:1]
    expected = torch.nn.functional.rms_norm(expected_residual, (D,), None, 1e-6)
    out = ltx_kernels.fused_add_rms_norm_(buffer[:1].expand(ROWS - 1, D), residual)
    assert_close(out, expected, torch.float32)
    assert_close(residual, expected_residual, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("glu", ["geglu", "swiglu"])
def test_out_may_not_overlap_the_input(device, glu):
    x = torch.randn(ROWS, 2 * D, device=device)
    fn = getattr(ltx_kernels, glu)
    with pytest.raises(ValueError, match=f"{glu}: out is written while x is read"):
        fn(x, out=x.view(-1)[: ROWS * D].view(ROWS, D))  # contiguous, in x's first rows
    out = torch.empty(ROWS, D, device=device)
    assert torch.equal(fn(x, out=out), fn(x))

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, DTYPES, HAS_CUDA, HIDDEN_SIZES, LAYOUTS, ROW_COUNTS, assert_close, make_rows


def rms_norm_formula(x, weight=None, eps=1e-6, weight_offset=0.0):
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (weight.double() + weight_offset)
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("with_weight", [True, False])
def test_matches_formula(device, dtype, hidden, rows, with_weight):
    x = make_rows(rows, hidden, dtype, device)
    weight = torch.randn(hidden, dtype=dtype, device=device) if with_weight else None
    out = ltx_kernels.rms_norm(x, weight, 1e-6)
    assert out.dtype == dtype and out.device == x.device and out.is_contiguous()
    assert_close(out, rms_norm_formula(x, weight), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_permuted_view_keeps_its_layout(device, dtype, op):
    """diffusers' processors norm q.transpose(1, 2), a [B, S, H, D] tensor read as [B, H, S, D]:
    its rows are dense in memory but do not collapse into one stride. The norm walks them in
    memory order (no copy first) and returns x's strides, as the Meta function says; values as
    the formula at every position."""
    x = torch.randn(2, 37, 3, 64, dtype=dtype, device=device).transpose(1, 2)
    weight = torch.randn(64, dtype=dtype, device=device)
    if op == "rms_norm":
        out, ref = ltx_kernels.rms_norm(x, weight, 1e-6), rms_norm_formula(x, weight)
    else:
        out, ref = ltx_kernels.layer_norm(x, weight, None, 1e-5), torch.nn.functional.layer_norm(
            x.double(), (64,), weight.double(), None, 1e-5)
    assert out.shape == x.shape and out.stride() == x.stride()
    assert_close(out, ref, dtype)
    fake = getattr(torch.ops.ltx_kernels, op)(x.to("meta"), weight.to("meta"), *(
        (1e-6, 0.0, None) if op == "rms_norm" else (None, 1e-5)))
    assert fake.stride() == x.stride()
    # a view whose rows are not dense (every other head) still gets a contiguous output
    sparse = x[:, ::2]
    out = ltx_kernels.rms_norm(sparse, weight, 1e-6)
    assert out.is_contiguous()
    assert_close(out, rms_norm_formula(sparse, weight), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96, 128])
@pytest.mark.parametrize("rows", [5, 33, 1000])
@pytest.mark.parametrize("layout", ["contiguous", "row_strided"])
def test_head_dim_rows_match_formula(device, dtype, hidden, rows, layout):
    """Rows of a head dim (QK norms): on CUDA several share a warp (8 or 16 threads each), the
    last block partly filled; every row must still be its own."""
    x = make_rows(rows, hidden, dtype, device, layout)
    x = x * torch.linspace(0.1, 10.0, rows, device=device, dtype=dtype)[:, None]  # each row its own scale
    weight = torch.randn(hidden, dtype=dtype, device=device)
    assert_close(ltx_kernels.rms_norm(x, weight, 1e-6), rms_norm_formula(x, weight), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("hidden", [8, 111, 2048])
def test_layouts(device, dtype, layout, hidden):
    x = make_rows(34, hidden, dtype, device, layout)
    weight = torch.randn(hidden, dtype=dtype, device=device)
    before = x.clone()
    out = ltx_kernels.rms_norm(x, weight, 1e-5)
    assert torch.equal(x, before), "input was modified"
    assert_close(out, rms_norm_formula(x, weight, 1e-5), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_weight_offset_and_batched_shape(device, dtype):
    x = torch.randn(2, 5, 3, 96, dtype=dtype, device=device)
    weight = torch.randn(96, dtype=dtype, device=device) * 0.1
    out = ltx_kernels.rms_norm(x, weight, 1e-6, weight_offset=1.0)
    assert out.shape == x.shape
    assert_close(out, rms_norm_formula(x, weight, 1e-6, 1.0), dtype)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN_SIZES + [32768, 40000])
def test_cuda_matches_cpu_reference(dtype, hidden):
    x = make_rows(19, hidden, dtype, "cuda", "row_strided")
    weight = torch.randn(hidden, dtype=dtype, device="cuda")
    out = ltx_kernels.rms_norm(x, weight, 1e-6)
    ref = ltx_kernels.rms_norm(x.cpu(), weight.cpu(), 1e-6)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_legacy_name(device):
    x = torch.randn(4, 64, device=device)
    weight = torch.randn(64, device=device)
    torch.testing.assert_close(ltx_kernels.rmsnorm(x, weight, 1e-6), ltx_kernels.rms_norm(x, weight, 1e-6))

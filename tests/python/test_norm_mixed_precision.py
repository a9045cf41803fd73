"""Mixed precision in the norms that torch modules compute (rms_norm, fused_add_rms_norm(_),
layer_norm): a float32 weight / bias beside a 16-bit input, and rms_norm's float32 output.

The kernels read the fp32 weights whole (no rounding to the input's dtype) and, with
out_dtype=float32, do not round the result: both are checked against the fp64 formula at the
fp32 tolerance, which a rounding to 16 bits anywhere fails."""

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, HAS_CUDA, LAYOUTS, assert_close, make_rows
from test_layer_norm import layer_norm_formula
from test_rms_norm import rms_norm_formula

HALF_DTYPES = [torch.float16, torch.bfloat16]
# Odd, vectorized, register-cached and streamed rows (40000 > 8 vectors x 256 threads x 8).
HIDDEN = [1, 7, 111, 2048, 5125, 40000]


def fp32_weight(hidden, device, offset=0.0):
    """Random fp32 values with more bits than a 16-bit dtype holds."""
    return torch.randn(hidden, device=device) + offset


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", [0, 3, 67])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_rms_norm_fp32_weight(device, dtype, hidden, rows, out_dtype):
    x = make_rows(rows, hidden, dtype, device)
    weight = fp32_weight(hidden, device)
    out = ltx_kernels.rms_norm(x, weight, 1e-6, out_dtype=out_dtype)
    assert out.dtype == (out_dtype or dtype) and out.shape == x.shape
    assert_close(out, rms_norm_formula(x, weight), out.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("weight", ["none", "dtype"])
def test_rms_norm_fp32_out_with_a_weight_in_x_dtype_or_none(device, dtype, weight):
    """out_dtype=float32 needs no fp32 weight: a 16-bit one is widened (exactly)."""
    x = torch.randn(5, 3, 111, dtype=dtype, device=device)
    w = None if weight == "none" else torch.randn(111, dtype=dtype, device=device)
    out = ltx_kernels.rms_norm(x, w, 1e-5, weight_offset=1.0 if w is not None else 0.0, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close(out, rms_norm_formula(x, w, 1e-5, 1.0 if w is not None else 0.0), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts(device, dtype, layout):
    x = make_rows(34, 2048, dtype, device, layout)
    weight = fp32_weight(2048, device)
    before = x.clone()
    out = ltx_kernels.rms_norm(x, weight, 1e-6, out_dtype=torch.float32)
    assert torch.equal(x, before)
    assert_close(out, rms_norm_formula(x, weight), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("params", ["fp32", "weight_fp32_bias_dtype", "bias_only_fp32"])
def test_layer_norm_fp32_params(device, dtype, hidden, params):
    x = make_rows(19, hidden, dtype, device) * 3 + 2
    weight = fp32_weight(hidden, device)
    bias = fp32_weight(hidden, device)
    if params == "weight_fp32_bias_dtype":
        bias = bias.to(dtype)
    if params == "bias_only_fp32":
        weight = None
    out = ltx_kernels.layer_norm(x, weight, bias, 1e-5)
    assert out.dtype == dtype
    assert_close(out, layer_norm_formula(x, weight, bias, 1e-5), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_fused_add_rms_norm_fp32_weight(device, dtype, hidden):
    x = make_rows(7, hidden, dtype, device)
    residual = make_rows(7, hidden, dtype, device)
    weight = fp32_weight(hidden, device)
    h = x + residual  # rounded to dtype, as the op's new residual
    out, new_residual = ltx_kernels.fused_add_rms_norm(x, residual, weight, 1e-6)
    assert out.dtype == new_residual.dtype == dtype
    assert torch.equal(new_residual, h)
    assert_close(out, rms_norm_formula(h, weight), dtype)
    in_place = residual.clone()
    out_ = ltx_kernels.fused_add_rms_norm_(x, in_place, weight, 1e-6)
    assert torch.equal(in_place, h) and torch.equal(out_, out)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_cuda_matches_cpu_reference(dtype, hidden):
    x = make_rows(19, hidden, dtype, "cuda", "row_strided")
    weight = fp32_weight(hidden, "cuda")
    bias = fp32_weight(hidden, "cuda")
    for out_dtype in (None, torch.float32):
        out = ltx_kernels.rms_norm(x, weight, 1e-6, out_dtype=out_dtype)
        assert_close(out, ltx_kernels.rms_norm(x.cpu(), weight.cpu(), 1e-6, out_dtype=out_dtype), out.dtype)
    assert_close(ltx_kernels.layer_norm(x, weight, bias), ltx_kernels.layer_norm(x.cpu(), weight.cpu(), bias.cpu()),
                 dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_gradients(device, dtype):
    """Gradients in each argument's own dtype (an fp32 weight gets an fp32 gradient), against
    fp64 autograd of the formula."""
    x = torch.randn(6, 40, dtype=dtype, device=device, requires_grad=True)
    weight = fp32_weight(40, device).requires_grad_()
    bias = fp32_weight(40, device).requires_grad_()
    for out_dtype in (None, torch.float32):
        out = ltx_kernels.rms_norm(x, weight, 1e-6, out_dtype=out_dtype)
        grad = torch.randn_like(out)
        gx, gw = torch.autograd.grad(out, (x, weight), grad)
        x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
        rx, rw = torch.autograd.grad(rms_norm_formula(x64, w64), (x64, w64), grad.double())
        assert gx.dtype == dtype and gw.dtype == torch.float32
        assert_close(gx, rx, dtype)
        assert_close(gw, rw, dtype)  # from dtype-rounded inputs: the dtype's tolerance
    out = ltx_kernels.layer_norm(x, weight, bias)
    grads = torch.autograd.grad(out.float().sum(), (x, weight, bias))
    assert [g.dtype for g in grads] == [dtype, torch.float32, torch.float32]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_meta_shapes_and_dtypes(dtype):
    x = torch.empty(2, 3, 64, dtype=dtype, device="meta")
    weight = torch.empty(64, device="meta")
    assert ltx_kernels.rms_norm(x, weight, out_dtype=torch.float32).dtype == torch.float32
    assert ltx_kernels.rms_norm(x, weight).dtype == dtype
    assert ltx_kernels.layer_norm(x, weight, weight).dtype == dtype
    out, new_residual = ltx_kernels.fused_add_rms_norm(x, x, weight)
    assert out.dtype == new_residual.dtype == dtype


def test_opcheck():
    x = torch.randn(3, 5, 24, dtype=torch.bfloat16)
    weight = torch.randn(24, requires_grad=True)
    torch.library.opcheck(torch.ops.ltx_kernels.rms_norm.default, (x, weight, 1e-6, 0.0, torch.float32))
    torch.library.opcheck(torch.ops.ltx_kernels.layer_norm.default, (x, weight, weight.detach(), 1e-5))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    x = torch.randn(4, 64, dtype=torch.bfloat16, device=device)
    weight = fp32_weight(64, device)

    def f(x):
        return ltx_kernels.rms_norm(x, weight, 1e-6, out_dtype=torch.float32) + ltx_kernels.layer_norm(x, weight)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_dtypes_are_named(device):
    x = torch.randn(4, 64, dtype=torch.bfloat16, device=device)
    half = torch.randn(64, dtype=torch.float16, device=device)
    fp32 = torch.randn(64, device=device)
    with pytest.raises(TypeError, match=r"weight must have the dtype of x \(BFloat16\) or float32, got Half"):
        ltx_kernels.rms_norm(x, half)
    with pytest.raises(TypeError, match=r"bias must have the dtype of x \(BFloat16\) or float32, got Half"):
        ltx_kernels.layer_norm(x, fp32, half)
    with pytest.raises(TypeError, match=r"rms_norm: out_dtype must be the dtype of x \(BFloat16\) or float32, got Half"):
        ltx_kernels.rms_norm(x, fp32, out_dtype=torch.float16)
    # The AdaLN and FP8 forms take weights in x's dtype only.
    scale = torch.zeros(64, dtype=torch.bfloat16, device=device)
    with pytest.raises(TypeError, match=r"weight must have the dtype of x \(BFloat16\), got Float"):
        ltx_kernels.adaln_rms_norm(x, scale, scale, fp32)
    with pytest.raises(TypeError, match=r"weight must have the dtype of x \(BFloat16\), got Float"):
        ltx_kernels.rms_norm_fp8(x, fp32)

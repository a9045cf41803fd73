"""The norms with an FP8 output (rms_norm_fp8, fused_add_rms_norm_fp8, adaln_rms_norm_fp8,
adaln_layer_norm_fp8, gated_residual_adaln_rms_norm_fp8):
bit for bit the unfused composition quantize_fp8(norm(...)) on the same device (their
definition), close to the fp64 formula, every broadcast form and layout, odd and streamed row
lengths, zero / inf / NaN rows, Meta shapes, compile and bad input."""

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, DTYPES, LAYOUTS, make_rows
from test_adaln import KINDS, modulate, modulation
from test_fp8 import FP8, torch_quantize
from test_rms_norm import rms_norm_formula

ops = torch.ops.ltx_kernels

# (batch, tokens, hidden): odd sizes, LTX's width, and a row too long for registers (the
# streamed kernel: more than 2048 vectors of 16 bytes).
SHAPES = [(2, 7, 64), (1, 1, 8), (3, 5, 2048), (2, 3, 111), (1, 2, 20000)]


def assert_same_fp8(got: tuple, want: tuple):
    """Same e4m3 values (NaN as NaN, whatever its sign bit) and the same scales."""
    (q, scale), (ref_q, ref_scale) = got, want
    assert q.dtype == FP8 and q.shape == ref_q.shape and scale.shape == ref_scale.shape
    assert torch.equal(scale.isnan(), ref_scale.isnan())
    assert torch.equal(scale.nan_to_num(), ref_scale.nan_to_num())
    a, b = q.float(), ref_q.float()
    assert torch.equal(a.isnan(), b.isnan())
    assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def assert_near_formula(q, scale, normed64, dtype):
    """Dequantized, within one e4m3 step of the fp64 formula quantized the same way (the
    kernel's value rounded to dtype may sit one dtype step from the formula's)."""
    ref_q, ref_scale = torch_quantize(normed64.to(dtype))
    deq = q.double() * scale.double()[..., None]
    ref = ref_q.double() * ref_scale.double()[..., None]
    step = ref.abs() * 2.0**-3 + scale.double()[..., None] * 2.0**-9
    assert ((deq - ref).abs() <= 2 * step + 1e-30).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,s,d", SHAPES)
@pytest.mark.parametrize("weight_kind", ["none", "weight", "gemma"])
def test_rms_norm_fp8_is_the_composition(device, dtype, b, s, d, weight_kind):
    x = torch.randn(b, s, d, dtype=dtype, device=device) * 3
    weight = torch.randn(d, dtype=dtype, device=device) if weight_kind != "none" else None
    offset = 1.0 if weight_kind == "gemma" else 0.0
    got = ltx_kernels.rms_norm_fp8(x, weight, 1e-6, weight_offset=offset)
    assert_same_fp8(got, ltx_kernels.quantize_fp8(ltx_kernels.rms_norm(x, weight, 1e-6, weight_offset=offset)))
    assert_near_formula(*got, rms_norm_formula(x, weight, 1e-6, offset), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,s,d", SHAPES)
def test_fused_add_rms_norm_fp8_is_the_composition(device, dtype, b, s, d):
    x, residual = (torch.randn(b, s, d, dtype=dtype, device=device) for _ in range(2))
    weight = torch.randn(d, dtype=dtype, device=device)
    q, q_scale, new_residual = ltx_kernels.fused_add_rms_norm_fp8(x, residual, weight, 1e-6)
    out, ref_residual = ltx_kernels.fused_add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(new_residual, ref_residual)
    assert_same_fp8((q, q_scale), ltx_kernels.quantize_fp8(out))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b,s,d", SHAPES)
@pytest.mark.parametrize("with_weight", [False, True])
def test_adaln_rms_norm_fp8_is_the_composition(device, dtype, kind, b, s, d, with_weight):
    x = torch.randn(b, s, d, dtype=dtype, device=device) * 3
    scale, shift = modulation(kind, b, s, d, dtype, device)
    weight = torch.randn(d, dtype=dtype, device=device) if with_weight else None
    got = ltx_kernels.adaln_rms_norm_fp8(x, scale, shift, weight, 1e-6)
    assert_same_fp8(got, ltx_kernels.quantize_fp8(ltx_kernels.adaln_rms_norm(x, scale, shift, weight, 1e-6)))
    assert_near_formula(*got, modulate(rms_norm_formula(x, weight), scale, shift), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b,s,d", SHAPES)
@pytest.mark.parametrize("affine", ["none", "weight", "weight_bias"])
def test_adaln_layer_norm_fp8_is_the_composition(device, dtype, kind, b, s, d, affine):
    """Rows with a large mean too (the LayerNorm's centring before its variance)."""
    x = torch.randn(b, s, d, dtype=dtype, device=device) * 3 + 20
    scale, shift = modulation(kind, b, s, d, dtype, device)
    weight = torch.randn(d, dtype=dtype, device=device) if affine != "none" else None
    bias = torch.randn(d, dtype=dtype, device=device) if affine == "weight_bias" else None
    got = ltx_kernels.adaln_layer_norm_fp8(x, scale, shift, weight, bias, 1e-6)
    assert_same_fp8(got, ltx_kernels.quantize_fp8(ltx_kernels.adaln_layer_norm(x, scale, shift, weight, bias, 1e-6)))
    x64 = x.double()
    normed = torch.nn.functional.layer_norm(x64, (d,), None if weight is None else weight.double(),
                                            None if bias is None else bias.double(), 1e-6)
    assert_near_formula(*got, modulate(normed, scale, shift), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b,s,d", SHAPES)
@pytest.mark.parametrize("with_gate", [False, True])
def test_gated_residual_adaln_rms_norm_fp8_is_the_composition(device, dtype, kind, b, s, d, with_gate):
    x = torch.randn(b, s, d, dtype=dtype, device=device)
    y = torch.randn(b, s, d, dtype=dtype, device=device)
    scale, shift = modulation(kind, b, s, d, dtype, device)
    gate = modulation(kind, b, s, d, dtype, device)[0] if with_gate else None
    weight = torch.randn(d, dtype=dtype, device=device)
    x_new, q, q_scale = ltx_kernels.gated_residual_adaln_rms_norm_fp8(x, y, gate, scale, shift, weight, 1e-6)
    ref_x_new, normed = ltx_kernels.gated_residual_adaln_rms_norm(x, y, gate, scale, shift, weight, 1e-6)
    assert torch.equal(x_new, ref_x_new)
    assert_same_fp8((q, q_scale), ltx_kernels.quantize_fp8(normed))
    assert_near_formula(q, q_scale, modulate(rms_norm_formula(ref_x_new, weight), scale, shift), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_inputs(device, dtype, layout):
    """Rows that are slices of a wider tensor, misaligned or non-collapsible views: read in
    place or copied, the result is the composition's."""
    x = make_rows(12, 264, dtype, device, layout).reshape(3, 4, 264) if layout != "non_collapsible" \
        else make_rows(12, 264, dtype, device, layout)
    y = make_rows(12, 264, dtype, device, layout).reshape(x.shape)
    scale, shift = modulation("per_token", x.size(0), x.size(1), 264, dtype, device) if x.dim() == 3 \
        else modulation("vector", 0, 0, 264, dtype, device)
    got = ltx_kernels.adaln_rms_norm_fp8(x, scale, shift)
    assert_same_fp8(got, ltx_kernels.quantize_fp8(ltx_kernels.adaln_rms_norm(x, scale, shift)))
    got = ltx_kernels.adaln_layer_norm_fp8(x, scale, shift)
    assert_same_fp8(got, ltx_kernels.quantize_fp8(ltx_kernels.adaln_layer_norm(x, scale, shift)))
    x_new, *got = ltx_kernels.gated_residual_adaln_rms_norm_fp8(x, y, None, scale, shift)
    ref_x_new, normed = ltx_kernels.gated_residual_adaln_rms_norm(x, y, None, scale, shift)
    assert torch.equal(x_new, ref_x_new)
    assert_same_fp8(tuple(got), ltx_kernels.quantize_fp8(normed))


@pytest.mark.parametrize("device", DEVICES)
def test_zero_inf_and_nan_rows(device):
    """A zero row (after modulation: scale -1, shift 0) gets the tiny scale and zero bytes; a
    row with inf or NaN gets a non-finite scale, as quantize_fp8 documents."""
    x = torch.randn(4, 64, device=device)
    x[2, 5] = float("inf")
    x[3, 7] = float("nan")
    scale = torch.zeros(4, 64, device=device)
    scale[0] = -1.0  # row 0 normalizes to zeros
    shift = torch.zeros(4, 64, device=device)
    q, s = ltx_kernels.adaln_rms_norm_fp8(x, scale, shift)
    assert_same_fp8((q, s), ltx_kernels.quantize_fp8(ltx_kernels.adaln_rms_norm(x, scale, shift)))
    assert torch.equal(q[0].float(), torch.zeros(64, device=device)) and s[0].item() == pytest.approx(1e-12 / 448)
    assert not s[2:].isfinite().any()


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_meta(device):
    x = torch.randn(0, 3, 64, device=device)
    w = torch.randn(64, device=device)
    q, s = ltx_kernels.adaln_rms_norm_fp8(x, w, w)
    assert q.shape == (0, 3, 64) and q.dtype == FP8 and s.shape == (0, 3) and s.dtype == torch.float32
    m = torch.empty(2, 5, 64, device="meta")
    x_new, q, s = ops.gated_residual_adaln_rms_norm_fp8(m, m, None, w.to("meta"), w.to("meta"))
    assert x_new.shape == (2, 5, 64) and q.shape == (2, 5, 64) and q.dtype == FP8 and s.shape == (2, 5)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    x, y = torch.randn(2, 5, 64, device=device), torch.randn(2, 5, 64, device=device)
    scale, shift, w = (torch.randn(2, 1, 64, device=device) for _ in range(3))
    torch.library.opcheck(ops.adaln_rms_norm_fp8.default, (x, scale, shift, w[0, 0], 1e-6))
    torch.library.opcheck(ops.adaln_layer_norm_fp8.default, (x, scale, shift, w[0, 0], w[1, 0], 1e-6))
    torch.library.opcheck(ops.rms_norm_fp8.default, (x, w[0, 0], 1e-6, 1.0))
    torch.library.opcheck(ops.fused_add_rms_norm_fp8.default, (x, y, None, 1e-6, 0.0))
    torch.library.opcheck(ops.gated_residual_adaln_rms_norm_fp8.default, (x, y, w, scale, shift, None, 1e-6))

    def block(x, y, scale, shift):
        q, s = ltx_kernels.adaln_rms_norm_fp8(x * 2, scale, shift)
        x_new, q2, s2 = ltx_kernels.gated_residual_adaln_rms_norm_fp8(x, y, None, scale, shift)
        # The ops' own outputs, bit for bit (arithmetic on them here would let inductor contract
        # it into FMAs and round differently from eager).
        return q.view(torch.uint8), s, x_new, q2.view(torch.uint8), s2

    torch._dynamo.reset()
    got = torch.compile(block, fullgraph=True)(x, y, scale, shift)
    want = block(x, y, scale, shift)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_bad_input_names_the_op_and_argument():
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="adaln_rms_norm_fp8: eps must be >= 0"):
        ltx_kernels.adaln_rms_norm_fp8(x, x, x, None, -1.0)
    with pytest.raises((ValueError, TypeError), match="scale"):
        ltx_kernels.adaln_rms_norm_fp8(x, torch.randn(3, 64), x)
    with pytest.raises((ValueError, TypeError), match="y"):
        ltx_kernels.gated_residual_adaln_rms_norm_fp8(x, torch.randn(2, 32), None, x, x)
    with pytest.raises((ValueError, TypeError), match="adaln_layer_norm_fp8: .*bias"):
        ltx_kernels.adaln_layer_norm_fp8(x, x, x, None, torch.randn(32))


def test_forward_only():
    x = torch.randn(2, 64, requires_grad=True)
    w = torch.randn(64)
    with pytest.raises(RuntimeError, match="adaln_rms_norm_fp8"):
        ltx_kernels.adaln_rms_norm_fp8(x, w, w)
    with pytest.raises(RuntimeError, match="fused_add_rms_norm_fp8"):
        ltx_kernels.fused_add_rms_norm_fp8(x, x.detach(), w)
    with pytest.raises(RuntimeError, match="adaln_layer_norm_fp8"):
        ltx_kernels.adaln_layer_norm_fp8(x, w, w)

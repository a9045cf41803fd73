"""Activations (GELU-tanh, GEGLU, SwiGLU) and the gated residual."""

import math

import pytest
import torch
import torch.nn.functional as F

import ltx_kernels
from conftest import DEVICES, DTYPES, HAS_CUDA, LAYOUTS, activation_scale, assert_close, make_rows
from test_adaln import KINDS, modulation

ops = torch.ops.ltx_kernels


# The GELUs in forms without the cancellation of 1 + tanh and 1 + erf for negative x (in fp64,
# tanh(-19) == -1, so 0.5 x (1 + tanh(u)) is 0 where the true value is ~1e-28): equal to
# torch's formulas elsewhere (test_formulas_are_torchs).
def gelu_tanh_formula(x):
    x = x.double()
    return x / (1 + torch.exp(-2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gelu_formula(x):
    x = x.double()
    return 0.5 * x * torch.special.erfc(-x / math.sqrt(2))


def silu_formula(x):
    x = x.double()
    return x / (1 + torch.exp(-x))


AND_MUL = {
    "gelu_tanh_and_mul": gelu_tanh_formula,
    "gelu_and_mul": gelu_formula,
    "silu_and_mul": silu_formula,
}

SIZES = [1, 7, 111, 2048, 5125, 14336]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", SIZES)
@pytest.mark.parametrize("rows", [0, 1, 3, 67])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gelu_tanh(device, dtype, hidden, rows, layout):
    x = make_rows(rows, hidden, dtype, device, layout) * 3
    out = ltx_kernels.gelu_tanh(x)
    assert out.is_contiguous() and out.dtype == dtype
    assert_close(out, gelu_tanh_formula(x), dtype, scale=activation_scale(dtype))


def test_formulas_are_torchs():
    """The formulas above are torch's GELUs and SiLU, to fp64's rounding (and its cancellation
    for far negative inputs, where torch's give 0 and ours the tail)."""
    x = torch.linspace(-12, 12, 4801, dtype=torch.float64)
    torch.testing.assert_close(gelu_tanh_formula(x), F.gelu(x, approximate="tanh"), rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(gelu_formula(x), F.gelu(x), rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(silu_formula(x), F.silu(x), rtol=1e-13, atol=1e-15)


# Inputs whose activations lie in the far negative tail: where 1 + tanh (1 + erf) cancels in
# fp32 (x < -4.5) and fp64 (x < -7), where e^-2u passes fp32's range (x < -9.85: a fast division
# by more than 2^126 gives 0), and where the result leaves fp32's normal range (x < -10.8).
TAIL = [-3.0, -4.5, -6.0, -7.5, -9.0, -9.84, -9.86, -9.9, -10.2, -10.8, -12.0, -30.0, -87.0, -88.0,
        -90.0, -104.0, -1e4]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["gelu_tanh", *AND_MUL])
def test_negative_tail(device, dtype, name):
    """Each tail input alone (so the element's own value sets the tolerance, as for a single
    row of one element) and all together: the activation's value, not 0, wherever that value
    is a normal number of dtype."""
    formula = gelu_tanh_formula if name == "gelu_tanh" else AND_MUL[name]
    op = getattr(ltx_kernels, name)
    x = torch.tensor(TAIL, dtype=dtype, device=device)
    ones = torch.ones_like(x)
    for xs in [x, *x[:, None]]:
        out = op(xs) if name == "gelu_tanh" else op(xs, ones[: xs.numel()])
        assert_close(out, formula(xs), dtype, scale=activation_scale(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(AND_MUL))
@pytest.mark.parametrize("hidden", SIZES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_input_forms(device, dtype, name, hidden, layout):
    a = make_rows(6, hidden, dtype, device, layout) * 3
    b = make_rows(6, hidden, dtype, device, layout)
    out = getattr(ltx_kernels, name)(a, b)
    assert_close(out, AND_MUL[name](a) * b.double(), dtype, scale=activation_scale(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 2048, 14336])
@pytest.mark.parametrize("layout", ["contiguous", "row_strided", "misaligned"])
def test_concatenated_forms(device, dtype, hidden, layout):
    x = make_rows(5, 2 * hidden, dtype, device, layout) * 3
    first, second = x[:, :hidden], x[:, hidden:]
    assert_close(ltx_kernels.swiglu(x), silu_formula(first) * second.double(), dtype)
    assert_close(ltx_kernels.geglu(x), gelu_tanh_formula(first) * second.double(), dtype)
    assert_close(ltx_kernels.geglu(x, approximate="none"), gelu_formula(first) * second.double(), dtype)
    # The original signature: geglu(input, out=None, approximate=True).
    out = torch.full((5, hidden), float("nan"), dtype=dtype, device=device)
    assert ltx_kernels.geglu(x, out, False) is out
    assert_close(out, gelu_formula(first) * second.double(), dtype)
    out = torch.full((5, hidden), float("nan"), dtype=dtype, device=device)
    assert ltx_kernels.swiglu(x, out=out) is out
    assert_close(out, silu_formula(first) * second.double(), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS + ["none"])
@pytest.mark.parametrize("b,s,d", [(2, 7, 64), (1, 1, 8), (3, 5, 2048), (2, 3, 111)])
def test_gated_residual(device, dtype, kind, b, s, d):
    x = torch.randn(b, s, d, dtype=dtype, device=device)
    y = torch.randn(b, s, d, dtype=dtype, device=device)
    gate = None if kind == "none" else modulation(kind, b, s, d, dtype, device)[0]
    out = ltx_kernels.gated_residual(x, y, gate)
    ref = x.double() + y.double() * (1.0 if gate is None else gate.double())
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("device", DEVICES)
def test_gated_residual_strided_inputs(device, layout):
    x = make_rows(8, 96, torch.bfloat16, device, layout)
    y = make_rows(8, 96, torch.bfloat16, device, layout)
    gate = torch.randn(96, dtype=torch.bfloat16, device=device)
    assert_close(ltx_kernels.gated_residual(x, y, gate), x.double() + y.double() * gate.double(), torch.bfloat16)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [7, 2048, 14336])
def test_cuda_matches_cpu_reference(dtype, hidden):
    x = torch.randn(9, 2 * hidden, dtype=dtype, device="cuda") * 3
    a, b = x[:, :hidden], x[:, hidden:]
    for name in AND_MUL:
        fn = getattr(ltx_kernels, name)
        assert_close(fn(a, b), fn(a.cpu(), b.cpu()), dtype)
    assert_close(ltx_kernels.gelu_tanh(x), ltx_kernels.gelu_tanh(x.cpu()), dtype)
    gate = torch.randn(3, 1, hidden, dtype=dtype, device="cuda")
    xs, ys = a.reshape(3, 3, hidden), b.reshape(3, 3, hidden)
    assert_close(ltx_kernels.gated_residual(xs, ys, gate),
                 ltx_kernels.gated_residual(xs.cpu(), ys.cpu(), gate.cpu()), dtype)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_cuda_many_rows():
    # More row groups than one grid dimension holds (65535 * 4 rows): the kernel loops.
    x = torch.randn(300_000, 8, dtype=torch.bfloat16, device="cuda")
    assert_close(ltx_kernels.gelu_tanh(x), gelu_tanh_formula(x), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    x = torch.randn(3, 5, 64, device=device)
    y = torch.randn(3, 5, 64, device=device)
    gate = torch.randn(3, 1, 64, device=device)
    cat = torch.randn(3, 5, 128, device=device)
    cases = [
        (ops.gelu_tanh.default, (x,)),
        (ops.gelu_tanh_and_mul.default, (x, y)),
        (ops.gelu_and_mul.default, (x, y)),
        (ops.silu_and_mul.default, (x, y)),
        (ops.geglu.default, (cat, "none")),
        (ops.swiglu.default, (cat,)),
        (ops.swiglu.out, (cat,), {"out": torch.empty(3, 5, 64, device=device)}),
        (ops.geglu.out, (cat, "tanh"), {"out": torch.empty(3, 5, 64, device=device)}),
        (ops.gated_residual.default, (x, y, gate)),
        (ops.gated_residual.default, (x, y, None)),
    ]
    for op, args, *kwargs in cases:
        torch.library.opcheck(op, args, kwargs[0] if kwargs else None)

    def mlp(x, cat, gate):
        h = ltx_kernels.gelu_tanh(x) + ltx_kernels.swiglu(cat)
        return ltx_kernels.gated_residual(x, h * 2, gate) + ltx_kernels.geglu(cat, approximate=False)

    torch._dynamo.reset()
    compiled = torch.compile(mlp, fullgraph=True, dynamic=True)
    for s in (5, 9):
        args = (torch.randn(3, s, 64, device=device), torch.randn(3, s, 128, device=device), gate)
        assert_close(compiled(*args), mlp(*args), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_names_the_argument(device):
    x = torch.randn(4, 64, device=device)
    cases = [
        ("x must be float32", lambda: ltx_kernels.gelu_tanh(x.double())),
        ("b must have the shape of a", lambda: ltx_kernels.silu_and_mul(x, x[:, :32])),
        ("b must have the dtype of a", lambda: ltx_kernels.gelu_tanh_and_mul(x, x.half())),
        ("last dim of x must be even", lambda: ltx_kernels.swiglu(torch.randn(4, 7, device=device))),
        ("geglu: approximate must be True, False, 'tanh' or 'none'", lambda: ltx_kernels.geglu(x, approximate="fast")),
        ("out must have shape", lambda: ltx_kernels.swiglu(x, torch.empty(4, 64, device=device))),
        ("out must have the dtype of x", lambda: ltx_kernels.geglu(x, torch.empty(4, 32, device=device).half())),
        ("y must have the shape of x", lambda: ltx_kernels.gated_residual(x, x[:2])),
        ("gate must have shape", lambda: ltx_kernels.gated_residual(x, x, torch.randn(63, device=device))),
        ("x must have a contiguous last dim", lambda: ltx_kernels.gelu_tanh(x.t())),
    ]
    for message, call in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            call()

"""Gradients of the ops with a backward (issue 22): every gradient against autograd of the
plain-torch formula in fp64 on the same (rounded) inputs, for every dtype, odd and small sizes,
row-strided inputs, absent optional arguments and every broadcast form of scale / shift / gate;
opcheck (autograd registration, AOTAutograd tracing) and torch.compile of forward + backward."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICES, DTYPES, RoundedGradient, activation_scale, assert_close, rel_err
from test_elementwise import TAIL, gelu_formula, gelu_tanh_formula, silu_formula
from test_rope import llm_rope_formula, ltx_rope_formula, ltx_tables_fp64, rms_formula, rotate_interleaved

ops = torch.ops.ltx_kernels
SIZES = [1, 7, 64, 130]
# A norm of one or two channels maps every row to constants (+-1): its gradient is ~eps / x^2,
# nothing but rounding error in fp32, so the norms start at three channels.
NORM_SIZES = [3, 7, 64, 130]


def leaf(shape, dtype, device, strided=False):
    """A random leaf tensor requiring grad and the view the op gets: itself, or (strided) the
    same values as rows of a wider tensor (row stride D + 3), through which grads flow back."""
    t = torch.randn(shape, device=device).to(dtype).requires_grad_()
    if not strided:
        return t, t
    wide = torch.cat([t, t.new_zeros(*t.shape[:-1], 3)], -1)
    return t, wide[..., : shape[-1]]


def rounded(t, dtype):
    """t rounded to dtype with the identity's gradient: a value the forward stores and reads."""
    return t + (t.to(dtype).double() - t).detach()


def check_grads(ours, formula, leaves, views, dtype, scale=None):
    """ours(*views) and formula(*fp64 copies of leaves): the same gradients of a random linear
    function of the outputs, for every leaf; gradients in their leaf's dtype."""
    outs = ours(*views)
    outs = outs if isinstance(outs, tuple) else (outs,)
    cots = [torch.randn_like(o, dtype=torch.float32).to(o.dtype) for o in outs]
    present = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(outs, present, cots)
    copies = [None if t is None else t.detach().double().requires_grad_() for t in leaves]
    refs = formula(*copies)
    refs = refs if isinstance(refs, tuple) else (refs,)
    # (a formula may compute on the CPU: its cotangents go where its outputs are)
    ref_grads = torch.autograd.grad(refs, [c for c in copies if c is not None],
                                    [c.double().to(r.device) for c, r in zip(cots, refs)])
    scale = scale or (10.0 if dtype == torch.float32 else 2.0)  # fp32: within 1e-4 relative
    for g, r, t in zip(grads, ref_grads, present):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert_close(g, r, dtype, scale=scale)


def rms(x, eps):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def layer(x, eps):
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


def row_vector(kind, b, s, d, dtype, device):
    """scale / shift / gate in a broadcast form a DiT passes: [D], [B, 1, D] or [B, S, D]."""
    shape = {"vector": (d,), "per_batch": (b, 1, d), "per_token": (b, s, d)}[kind]
    return leaf(shape, dtype, device, strided=kind == "per_token")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", NORM_SIZES)
@pytest.mark.parametrize("weight_kind", ["none", "weight", "gemma"])
@pytest.mark.parametrize("strided", [False, True])
def test_rms_norm(device, dtype, d, weight_kind, strided):
    x, xv = leaf((2, 5, d), dtype, device, strided)
    w, _ = leaf((d,), dtype, device) if weight_kind != "none" else (None, None)
    offset = 1.0 if weight_kind == "gemma" else 0.0

    def formula(x, w):
        y = rms(x, 1e-6)
        return y if w is None else y * (w + offset)

    check_grads(lambda x, w: ops.rms_norm(x, w, 1e-6, offset), formula, [x, w], [xv, w], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", NORM_SIZES)
@pytest.mark.parametrize("affine", [(False, False), (True, False), (True, True), (False, True)])
def test_layer_norm(device, dtype, d, affine):
    x, xv = leaf((3, 4, d), dtype, device, strided=True)
    w = leaf((d,), dtype, device)[0] if affine[0] else None
    b = leaf((d,), dtype, device)[0] if affine[1] else None

    def formula(x, w, b):
        return F.layer_norm(x, (d,), w, b, 1e-5)

    check_grads(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), formula, [x, w, b], [xv, w, b], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", NORM_SIZES)
@pytest.mark.parametrize("with_weight", [False, True])
def test_fused_add_rms_norm(device, dtype, d, with_weight):
    x, xv = leaf((2, 3, d), dtype, device, strided=True)
    res, resv = leaf((2, 3, d), dtype, device)
    w = leaf((d,), dtype, device)[0] if with_weight else None

    def formula(x, res, w):
        h = rounded(x + res, dtype)
        y = rms(h, 1e-6)
        return (y if w is None else y * w), h

    check_grads(lambda x, r, w: ops.fused_add_rms_norm(x, r, w, 1e-6), formula, [x, res, w], [xv, resv, w], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [64, 16392])
def test_layer_norm_backward_large_mean(device, d):
    """Rows of mean 1e3 and std 1e-2 in fp32 (mean / std = 1e5): the gradient keeps their spread
    (the ATen composition, centred on the row's mean alone, was off by 2e-3 at D = 16392)."""
    x, _ = leaf((5, d), torch.float32, device)
    with torch.no_grad():
        x.copy_(1e3 + 1e-2 * torch.randn_like(x))
    w, _ = leaf((d,), torch.float32, device)
    b, _ = leaf((d,), torch.float32, device)
    check_grads(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), lambda x, w, b: F.layer_norm(x, (d,), w, b, 1e-5),
                [x, w, b], [x, w, b], torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused norm backward kernel runs on CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, d", [(1, 4096), (1000, 64), (1000, 1536), (333, 2056), (600, 4096), (70, 8192),
                                     (9, 16384), (5, 16392), (3000, 1000)])
@pytest.mark.parametrize("op", ["rms_norm", "gemma_rms_norm", "fused_add_rms_norm", "layer_norm"])
def test_cuda_fused_norm_backward(dtype, rows, d, op):
    """The fused kernel's every shape class: a warp a row (D <= 512 bf16), 256 threads a row
    with 1 / 2 / 4 / 8 vectors each, rows too long for registers (16392 bf16: the composition
    runs), vector counts just past a power of two (2056 = 8 x 257), row strides that allow no
    16-byte vectors (rms_norm's rows are D + 3 apart), more rows than blocks (the per-block fp32
    weight and bias partial sums), and layer norm rows with mean 1e3 and std 1e-2 (in fp32 the
    gradient must keep their spread)."""
    x, xv = leaf((rows, d), dtype, "cuda", strided=op == "rms_norm")
    if op == "layer_norm":
        with torch.no_grad():
            x.copy_(1e3 + 1e-2 * torch.randn_like(x, dtype=torch.float32))
    w, _ = leaf((d,), dtype, "cuda")
    if op == "fused_add_rms_norm":
        res, _ = leaf((rows, d), dtype, "cuda")
        check_grads(lambda x, r, w: ops.fused_add_rms_norm(x, r, w, 1e-6),
                    lambda x, r, w: (rms(rounded(x + r, dtype), 1e-6) * w, rounded(x + r, dtype)),
                    [x, res, w], [xv, res, w], dtype)
    elif op == "layer_norm":
        b, _ = leaf((d,), dtype, "cuda")
        check_grads(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), lambda x, w, b: F.layer_norm(x, (d,), w, b, 1e-5),
                    [x, w, b], [xv, w, b], dtype)
    else:
        offset = 1.0 if op == "gemma_rms_norm" else 0.0
        check_grads(lambda x, w: ops.rms_norm(x, w, 1e-6, offset), lambda x, w: rms(x, 1e-6) * (w + offset),
                    [x, w], [xv, w], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [7, 64])
@pytest.mark.parametrize("kind", ["vector", "per_batch", "per_token"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("affine", [False, True])
def test_adaln(device, dtype, d, kind, norm, affine):
    b, s = 2, 5
    x, xv = leaf((b, s, d), dtype, device, strided=True)
    scale, scale_v = row_vector(kind, b, s, d, dtype, device)
    shift, shift_v = row_vector(kind, b, s, d, dtype, device)
    w = leaf((d,), dtype, device)[0] if affine else None
    if norm == "rms":
        def ours(x, scale, shift, w):
            return ops.adaln_rms_norm(x, scale, shift, w, 1e-6)

        def formula(x, scale, shift, w):
            y = rms(x, 1e-6)
            return (y if w is None else y * w) * (1 + scale) + shift

        check_grads(ours, formula, [x, scale, shift, w], [xv, scale_v, shift_v, w], dtype)
    else:
        bias = leaf((d,), dtype, device)[0] if affine else None

        def ours(x, scale, shift, w, bias):
            return ops.adaln_layer_norm(x, scale, shift, w, bias, 1e-6)

        def formula(x, scale, shift, w, bias):
            return F.layer_norm(x, (d,), w, bias, 1e-6) * (1 + scale) + shift

        check_grads(ours, formula, [x, scale, shift, w, bias], [xv, scale_v, shift_v, w, bias], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [3, 64, 130])
@pytest.mark.parametrize("gate_kind", ["none", "vector", "per_batch", "per_token"])
def test_gated_residual_and_adaln(device, dtype, d, gate_kind):
    b, s = 2, 3
    x, xv = leaf((b, s, d), dtype, device)
    y, yv = leaf((b, s, d), dtype, device, strided=True)
    gate, gate_v = row_vector(gate_kind, b, s, d, dtype, device) if gate_kind != "none" else (None, None)
    scale, scale_v = row_vector("per_batch", b, s, d, dtype, device)
    shift, shift_v = row_vector("vector", b, s, d, dtype, device)
    w = leaf((d,), dtype, device)[0]

    def branch(x, y, gate):
        return x + (y if gate is None else y * gate)

    check_grads(lambda x, y, g: ops.gated_residual(x, y, g), branch, [x, y, gate], [xv, yv, gate_v], dtype)

    def ours(x, y, gate, scale, shift, w):
        return ops.gated_residual_adaln_rms_norm(x, y, gate, scale, shift, w, 1e-6)

    def formula(x, y, gate, scale, shift, w):
        x_new = rounded(branch(x, y, gate), dtype)
        return x_new, rms(x_new, 1e-6) * w * (1 + scale) + shift

    check_grads(ours, formula, [x, y, gate, scale, shift, w], [xv, yv, gate_v, scale_v, shift_v, w], dtype)


ACTIVATIONS = {"gelu_tanh_and_mul": gelu_tanh_formula, "gelu_and_mul": gelu_formula, "silu_and_mul": silu_formula}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", SIZES)
@pytest.mark.parametrize("name", ["gelu_tanh", *ACTIVATIONS, "geglu_tanh", "geglu_none", "swiglu"])
def test_activations(device, dtype, d, name):
    """Inputs scaled by 3 reach the far negative tail (test_elementwise.TAIL) now and then. The
    op reads x * 3 as rounded to dtype, and so does the formula: near a zero of gelu's
    derivative the unrounded product's gradient differs by more than the tolerance (bf16, 3
    elements: 11 failures in 3000 seeds before, 0 after)."""
    if name == "gelu_tanh":
        x, xv = leaf((3, d), dtype, device, strided=True)
        check_grads(lambda x: ops.gelu_tanh(x * 3), lambda x: gelu_tanh_formula(rounded(x * 3, dtype)), [x], [xv],
                    dtype)
    elif name in ACTIVATIONS:
        a, av = leaf((2, 3, d), dtype, device, strided=True)
        b, bv = leaf((2, 3, d), dtype, device)
        act = ACTIVATIONS[name]
        check_grads(lambda a, b: getattr(ops, name)(a, b), lambda a, b: act(a) * b, [a, b], [av, bv], dtype)
    else:
        x, xv = leaf((2, 3, 2 * d), dtype, device, strided=True)
        act = {"geglu_tanh": gelu_tanh_formula, "geglu_none": gelu_formula, "swiglu": silu_formula}[name]

        def ours(x):
            return ops.swiglu(x) if name == "swiglu" else ops.geglu(x, name.split("_")[1])

        check_grads(ours, lambda x: act(x[..., :d]) * x[..., d:], [x], [xv], dtype)


# Activations in fp64 whose autograd stays finite at any input: x * sigmoid(z) rather than
# x / (1 + exp(-z)), whose derivative is inf / inf once exp(-z) overflows (z < -709).
def gelu_tanh_stable(x):
    return x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))


def silu_stable(x):
    return x * torch.sigmoid(x)


# The activations' backward ops, called as autograd calls them: (op, activation formula, form),
# form "x" (gelu_tanh: grad of x), "a, b" (the *_and_mul ops: grads of a and b) or "[a | b]"
# (geglu / swiglu: one gradient of the concatenated x).
ACTIVATION_BACKWARDS = [
    ("gelu_tanh_backward", gelu_tanh_stable, "x", ()),
    ("gelu_tanh_and_mul_backward", gelu_tanh_stable, "a, b", ()),
    ("gelu_and_mul_backward", gelu_formula, "a, b", ()),
    ("silu_and_mul_backward", silu_stable, "a, b", ()),
    ("geglu_backward", gelu_tanh_stable, "[a | b]", ("tanh",)),
    ("geglu_backward", gelu_formula, "[a | b]", ("none",)),
    ("swiglu_backward", silu_stable, "[a | b]", ()),
]
BACKWARD_IDS = [f"{n}{'-' + e[0] if e else ''}" for n, _, _, e in ACTIVATION_BACKWARDS]


def activation_backward_case(name, act, form, extra, a, b, grad):
    """The op's gradients for activation input a, multiplier b and grad_out, and fp64 autograd's
    of act(a) * b (act(a) for gelu_tanh) on the same values."""
    op = getattr(ops, name)
    a64, b64 = (t.detach().double().cpu().requires_grad_() for t in (a, b))
    ref = act(a64) if form == "x" else act(a64) * b64
    ref_grads = torch.autograd.grad(ref, [a64] if form == "x" else [a64, b64], grad.double().cpu())
    if form == "x":
        return (op(grad, a, *extra),), ref_grads
    if form == "a, b":
        return op(grad, a, b, *extra), ref_grads
    return op(grad, torch.cat([a, b], -1), *extra).chunk(2, -1), ref_grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grad_kind", ["dense", "row_broadcast", "sum"])
@pytest.mark.parametrize("name, act, form, extra", ACTIVATION_BACKWARDS, ids=BACKWARD_IDS)
def test_activation_backward_ops(device, dtype, grad_kind, name, act, form, extra):
    """Odd width, row-strided inputs, the far negative tail (test_elementwise.TAIL, but -1e4:
    the huge-input test has it) and the gradient layouts autograd passes: dense, one row
    broadcast over rows, and y.sum()'s scalar expanded to every element (stride 0 in every dim)."""
    d = 77
    tail = [t for t in TAIL if t > -1e3]
    a = torch.cat([torch.tensor(tail), torch.randn(3 * d - len(tail)) * 3]).reshape(3, d)
    a = torch.cat([a, torch.zeros(3, 5)], -1).to(dtype).to(device)[:, :d]  # row stride d + 5
    b = torch.randn(3, d, device=device).to(dtype)
    grad = {"dense": lambda: torch.randn(3, d), "row_broadcast": lambda: torch.randn(d).expand(3, d),
            "sum": lambda: torch.ones(()).expand(3, d)}[grad_kind]().to(dtype).to(device)
    grads, ref_grads = activation_backward_case(name, act, form, extra, a, b, grad)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == dtype
        assert_close(g, r, dtype, scale=activation_scale(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, act, form, extra", ACTIVATION_BACKWARDS, ids=BACKWARD_IDS)
def test_activation_backward_at_huge_inputs(device, dtype, name, act, form, extra):
    """|a| up to the dtype's largest finite value: the activation's slope is exactly 0 or 1
    there (GELU-tanh's cubic overflows fp32 from |a| ~ 1.8e19 on; 0 * inf must not be NaN)."""
    big = torch.finfo(dtype).max
    values = [1e4, 3e4, big / 2, big] if dtype != torch.float32 else [1e4, 1e19, 1e30, big]
    a = torch.tensor(values + [-v for v in values], dtype=dtype, device=device)[None]
    b = torch.full_like(a, 0.5)
    grad = torch.full_like(a, 0.25)
    grads, ref_grads = activation_backward_case(name, act, form, extra, a, b, grad)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double().cpu(), r.to(dtype).double(), rtol=0, atol=0)


@pytest.mark.parametrize("name, act, form, extra", ACTIVATION_BACKWARDS, ids=BACKWARD_IDS)
def test_activation_backward_op_checks(name, act, form, extra):
    """torch.library's checks of the backward ops themselves (Meta, fake tensors, schema), and
    a grad_out of the wrong shape named in a clear error."""
    a, b = torch.randn(3, 8), torch.randn(3, 8)
    x = a if form == "x" else (a, b) if form == "a, b" else (torch.cat([a, b], -1),)
    args = (torch.randn(3, 8), *(x if isinstance(x, tuple) else (x,)), *extra)
    torch.library.opcheck(getattr(ops, name).default, args)
    with pytest.raises(ValueError, match="grad_out must have"):
        getattr(ops, name)(torch.randn(3, 9), *args[1:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, n", [(1, 7, 5), (6, 64, 96), (33, 130, 17)])
def test_linear_gelu_tanh(device, dtype, rows, k, n):
    """The GEMMs of the gradients run in the input dtype, as torch's autograd of Linear + GELU:
    in 16 bits the gradient of h is rounded before them (one more rounding, scale 4)."""
    x, xv = leaf((rows, k), dtype, device, strided=True)
    w = (torch.randn(n, k, device=device) / math.sqrt(k)).to(dtype).requires_grad_()
    b = torch.randn(n, device=device).to(dtype).requires_grad_()

    def formula(x, w, b):
        h = x @ w.T + b
        return gelu_tanh_formula(h if dtype == torch.float32 else rounded(h, dtype))

    check_grads(lambda x, w, b: ops.linear_gelu_tanh(x, w, b), formula, [x, w, b], [xv, w, b], dtype,
                scale=10.0 if dtype == torch.float32 else 4.0)


GLU_FORMULAS = {"silu": silu_formula, "gelu_tanh": gelu_tanh_formula, "gelu": gelu_formula}


def glu_linear_formula(activation, dtype):
    """(act(a) * b) rounded to dtype (its gradient passed through) @ w.T + bias, with the
    activation's gradient rounded to dtype before the activation's backward, as the backward op
    (like torch's autograd of the activation, then Linear) computes it."""
    def formula(a, b, w, bias):
        h = RoundedGradient.apply(rounded(GLU_FORMULAS[activation](a) * b, dtype), dtype)
        return h @ w.T + (0 if bias is None else bias)
    return formula


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", sorted(GLU_FORMULAS))
@pytest.mark.parametrize("rows, k, n", [(1, 7, 5), (6, 64, 96), (33, 130, 17)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_glu_linear(device, dtype, activation, rows, k, n, with_bias):
    a, av = leaf((rows, k), dtype, device, strided=True)
    b, bv = leaf((rows, k), dtype, device)
    w = (torch.randn(n, k, device=device) / math.sqrt(k)).to(dtype).requires_grad_()
    bias = torch.randn(n, device=device).to(dtype).requires_grad_() if with_bias else None
    check_grads(lambda a, b, w, bias: ops.glu_linear(a, b, w, bias, activation), glu_linear_formula(activation, dtype),
                [a, b, w, bias], [av, bv, w, bias], dtype, scale=2 * activation_scale(dtype) * (5 if dtype == torch.float32 else 1))


@pytest.mark.parametrize("device", DEVICES)
def test_glu_linear_saves_its_inputs_not_the_activation(device):
    """Autograd keeps a and b (and the parameters): act(a) * b, the linear's input, is
    recomputed by the backward."""
    a, b = (torch.randn(4, 32, device=device, requires_grad=True) for _ in range(2))
    w = torch.randn(8, 32, device=device, requires_grad=True)
    out, saved = saved_storages(lambda a, b: ops.glu_linear(a, b, w, None, "silu"), a, b)
    assert saved == {t.untyped_storage().data_ptr() for t in (a, b, w)}
    stock, stock_saved = saved_storages(lambda a, b: F.linear(ops.silu_and_mul(a, b), w), a, b)
    assert len(stock_saved) == 4  # a, b, w and the activation
    assert torch.equal(out, stock)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bhsd", [True, False])
@pytest.mark.parametrize("rotary", ["full", "partial", "interleaved", "sections"])
@pytest.mark.parametrize("table", ["per_batch", "shared", "fp32"])
def test_apply_rotary_pos_emb(device, dtype, bhsd, rotary, table):
    """q and k (GQA: fewer k heads), full or partial rotary, half-split, interleaved or in
    sections; [B, S, R] or [S, R] tables in x's dtype or fp32, with gradients of their own
    (arbitrary values: the two halves of a pair need not share an angle)."""
    b, s, hq, hk, dh = 2, 5, 4, 2, 16
    r = 8 if rotary == "partial" else dh
    shape = (lambda h: (b, h, s, dh)) if bhsd else (lambda h: (b, s, h, dh))
    q, qv = leaf(shape(hq), dtype, device, strided=True)
    k, kv = leaf(shape(hk), dtype, device)
    table_dtype = torch.float32 if table == "fp32" else dtype
    tshape = (s, r) if table == "shared" else (b, s, r)
    cos, sin = (leaf(tshape, table_dtype, device)[0] for _ in range(2))
    interleaved = rotary == "interleaved"
    sections = [4, 8, 4] if rotary == "sections" else None
    unsqueeze_dim = 1 if bhsd else 2

    def ours(q, k, cos, sin):
        return ops.apply_rotary_pos_emb(q, k, cos, sin, interleaved, unsqueeze_dim, sections)

    def formula(q, k, cos, sin):
        if sections is None:
            return tuple(llm_rope_formula(t, cos, sin, unsqueeze_dim, interleaved) for t in (q, k))
        starts = [0, 4, 12]  # half-split rotation within each section
        outs = []
        for t in (q, k):
            pieces = [llm_rope_formula(t[..., a:a + n], cos[..., a:a + n], sin[..., a:a + n], unsqueeze_dim, False)
                      for a, n in zip(starts, sections)]
            outs.append(torch.cat(pieces, -1))
        return tuple(outs)

    check_grads(ours, formula, [q, k, cos, sin], [qv, kv, cos, sin], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [8, 14, 64])
@pytest.mark.parametrize("table", ["per_batch", "shared", "fp32"])
def test_ltx_rope(device, dtype, d, table):
    """diffusers' LTX tables: interleaved pairs over every channel, tables [B or 1, S, D] in
    x's dtype or fp32 with gradients of their own."""
    b, s = 2, 5
    x, xv = leaf((b, s, d), dtype, device, strided=True)
    table_dtype = torch.float32 if table == "fp32" else dtype
    cos, sin = (leaf((1 if table == "shared" else b, s, d), table_dtype, device)[0] for _ in range(2))
    check_grads(ops.ltx_rope, lambda x, cos, sin: x * cos + rotate_interleaved(x) * sin,
                [x, cos, sin], [xv, cos, sin], dtype)


def saved_storages(fn, *args):
    """fn(*args)'s outputs and the storages autograd saved for their backward."""
    saved = set()

    def pack(t):
        saved.add(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = fn(*args)
    return outs, saved


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["apply_rotary_pos_emb", "ltx_rope", "ltx_rope_angles"])
def test_rope_saves_its_inputs_only_for_the_tables_gradients(device, dtype, form):
    """The rotations are linear in q, k (x): with tables (video_coords) that do not require grad,
    as models build them, the backward saves none of q, k, x and still gets their gradients
    right; with tables that do, q, k, x are saved for the tables' gradients (the tests above)."""
    b, s, d = 2, 12, 12
    q, qv = leaf((b, s, 4, d), dtype, device, strided=True)
    k, kv = leaf((b, s, 2, d), dtype, device)
    x, xv = leaf((b, s, 4 * d), dtype, device, strided=True)
    if form == "apply_rotary_pos_emb":
        cos, sin = (torch.randn(b, s, d, device=device).to(dtype) for _ in range(2))
        ours = lambda q, k: ops.apply_rotary_pos_emb(q, k, cos, sin, False, 2, None)
        formula = lambda q, k: tuple(llm_rope_formula(t, cos.double(), sin.double(), 2, False) for t in (q, k))
        leaves, views = [q, k], [qv, kv]
    elif form == "ltx_rope":
        cos, sin = (torch.randn(b, s, 4 * d, device=device).to(dtype) for _ in range(2))
        ours = lambda x: ops.ltx_rope(x, cos, sin)
        formula = lambda x: x * cos.double() + rotate_interleaved(x) * sin.double()
        leaves, views = [x], [xv]
    else:
        grid, axis_scale = (2, 2, 3), (0.05, 0.1, 0.1)
        coords = torch.rand(b, 3, s, device=device) * 4.0
        ours = lambda x: ops.ltx_rope_angles(x, grid, axis_scale, coords, 100.0)
        formula = lambda x: ltx_rope_formula(x, *ltx_tables_fp64(b, s, 4 * d, grid, axis_scale, coords, 100.0))
        leaves, views = [x], [xv]
    _, saved = saved_storages(ours, *views)
    assert not {t.untyped_storage().data_ptr() for t in views} & saved
    check_grads(ours, formula, leaves, views, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_saves_the_sum_not_its_terms(device, dtype):
    """The backward reads new_residual (the rounded sum the norm read), saved as an output:
    neither x nor residual is kept, and both still get the right gradients."""
    x, xv = leaf((2, 3, 64), dtype, device, strided=True)
    res, resv = leaf((2, 3, 64), dtype, device)
    w = leaf((64,), dtype, device)[0]
    (out, new_residual), saved = saved_storages(lambda x, r: ops.fused_add_rms_norm(x, r, w, 1e-6), xv, resv)
    assert not {xv.untyped_storage().data_ptr(), resv.untyped_storage().data_ptr()} & saved
    assert new_residual.untyped_storage().data_ptr() in saved

    def formula(x, res, w):
        h = rounded(x + res, dtype)
        return rms(h, 1e-6) * w, h

    check_grads(lambda x, r, w: ops.fused_add_rms_norm(x, r, w, 1e-6), formula, [x, res, w], [xv, resv, w], dtype)


def ltx_positions_for_grad(kind, b, grid, device):
    """(video_coords leaf or None, axis_scale): the grid alone, or per-sample coordinates that
    require grad (positions a model computes; their gradient flows through the angles)."""
    if kind == "grid":
        return None, (1.0, 0.5, 0.25)
    f, h, w = grid
    coords = (torch.rand(b, 3, f * h * w, device=device) * torch.tensor([4.0, 6.0, 8.0], device=device)[None, :, None])
    return coords.requires_grad_(), (0.05, 0.1, 0.1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [12, 14, 64])
@pytest.mark.parametrize("positions", ["grid", "coords"])
def test_ltx_rope_angles(device, dtype, d, positions):
    """Angles in the kernel: D % 6 channels pass through, pairs turn by the position's angle;
    gradients of x and of video_coords (through the angles)."""
    b, grid = 2, (2, 2, 3)
    x, xv = leaf((b, 12, d), dtype, device, strided=True)
    coords, axis_scale = ltx_positions_for_grad(positions, b, grid, device)

    def ours(x, coords):
        return ops.ltx_rope_angles(x, grid, axis_scale, coords, 100.0)

    def formula(x, coords):
        cos, sin = ltx_tables_fp64(b, 12, d, grid, axis_scale, coords, 100.0)
        return ltx_rope_formula(x, cos, sin)

    check_grads(ours, formula, [x, coords], [xv, coords], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [12, 64])
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("positions", ["grid", "coords"])
def test_ltx_qk_norm_rope(device, dtype, d, weights, positions):
    """LTX's norm_q / norm_k (an RMS norm over all heads) and the RoPE in one op: gradients of
    q, k, both norm weights and the positions."""
    b, grid = 2, (2, 2, 3)
    q, qv = leaf((b, 12, d), dtype, device, strided=True)
    k, kv = leaf((b, 12, d), dtype, device)
    wq, wk = (leaf((d,), dtype, device)[0] if weights else None for _ in range(2))
    coords, axis_scale = ltx_positions_for_grad(positions, b, grid, device)

    def ours(q, k, wq, wk, coords):
        return ops.ltx_qk_norm_rope(q, k, wq, wk, 1e-6, grid, axis_scale, coords, 100.0)

    def formula(q, k, wq, wk, coords):
        cos, sin = ltx_tables_fp64(b, 12, d, grid, axis_scale, coords, 100.0)
        return tuple(ltx_rope_formula(rms_formula(t, w, 1e-6), cos, sin) for t, w in ((q, wq), (k, wk)))

    check_grads(ours, formula, [q, k, wq, wk, coords], [qv, kv, wq, wk, coords], dtype)


def test_gradcheck_fp32():
    """Finite differences in fp32 (the ops take no fp64): eps 1e-2 on inputs ~1, so the
    forward's fp32 rounding (~1e-7) adds ~1e-5 to each difference quotient."""
    x = torch.randn(3, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    gate = torch.randn(8, requires_grad=True)
    kw = dict(eps=1e-2, atol=2e-3, rtol=2e-2, fast_mode=False)
    assert torch.autograd.gradcheck(lambda x, w: ops.rms_norm(x, w, 1e-6, 0.0), (x, w), **kw)
    assert torch.autograd.gradcheck(lambda x, w: ops.layer_norm(x, w, w, 1e-5), (x, w), **kw)
    assert torch.autograd.gradcheck(lambda x, g: ops.gated_residual(x, x, g), (x, gate), **kw)
    assert torch.autograd.gradcheck(lambda x: ops.swiglu(x), (x,), **kw)


def test_unused_output_and_absent_grads():
    """A multi-output op whose second output is unused (its gradient taken as zeros), an
    input that does not require grad (it gets none) and an absent weight."""
    x = torch.randn(2, 16, requires_grad=True)
    res = torch.randn(2, 16)
    out, _ = ops.fused_add_rms_norm(x, res, None, 1e-6)
    out.sum().backward()
    x64 = x.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(rms(rounded(x64 + res.double(), torch.float32), 1e-6).sum(), [x64])
    assert_close(x.grad, ref, torch.float32, scale=10.0)
    assert res.grad is None


def test_backward_ops_are_not_differentiable_twice():
    """A second derivative (create_graph) raises, naming the backward op, not silent None."""
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="rms_norm_backward: `grad_out` requires grad.*no backward"):
        torch.autograd.grad(ops.rms_norm(x, None, 1e-6, 0.0).square().sum(), [x], create_graph=True)


OPCHECK = [
    ("rms_norm", lambda: (torch.randn(3, 16, requires_grad=True), torch.randn(16, requires_grad=True), 1e-6, 0.0)),
    ("layer_norm", lambda: (torch.randn(3, 16, requires_grad=True), torch.randn(16, requires_grad=True), None, 1e-5)),
    ("fused_add_rms_norm", lambda: (torch.randn(3, 16, requires_grad=True), torch.randn(3, 16), None, 1e-6, 0.0)),
    ("adaln_rms_norm", lambda: (torch.randn(2, 3, 16, requires_grad=True), torch.randn(2, 1, 16, requires_grad=True),
                                torch.randn(16, requires_grad=True), None, 1e-6)),
    ("gated_residual_adaln_rms_norm", lambda: (
        torch.randn(2, 3, 16, requires_grad=True), torch.randn(2, 3, 16, requires_grad=True),
        torch.randn(2, 1, 16, requires_grad=True), torch.randn(16), torch.randn(16), torch.randn(16), 1e-6)),
    ("gelu_tanh_and_mul", lambda: (torch.randn(3, 16, requires_grad=True), torch.randn(3, 16, requires_grad=True))),
    ("geglu", lambda: (torch.randn(3, 16, requires_grad=True), "none")),
    ("linear_gelu_tanh", lambda: (torch.randn(3, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True),
                                  torch.randn(8, requires_grad=True))),
    ("apply_rotary_pos_emb", lambda: (torch.randn(2, 4, 3, 8, requires_grad=True), torch.randn(2, 2, 3, 8),
                                      torch.randn(2, 3, 8), torch.randn(2, 3, 8), False, 1, None)),
    ("ltx_rope", lambda: (torch.randn(2, 3, 8, requires_grad=True), torch.randn(1, 3, 8), torch.randn(1, 3, 8))),
    ("ltx_rope_angles", lambda: (torch.randn(2, 6, 14, requires_grad=True), [1, 2, 3], [1.0, 1.0, 1.0],
                                 torch.rand(2, 3, 6, requires_grad=True), 100.0)),
    ("ltx_qk_norm_rope", lambda: (torch.randn(2, 6, 12, requires_grad=True), torch.randn(2, 6, 12),
                                  torch.randn(12, requires_grad=True), None, 1e-6, [1, 2, 3], [1.0, 1.0, 1.0],
                                  None, 100.0)),
    # The arguments whose gradient is another one (gradient_is, autograd.cpp), requiring grad.
    ("fused_add_rms_norm", lambda: (torch.randn(3, 16, requires_grad=True), torch.randn(3, 16, requires_grad=True),
                                    torch.randn(16, requires_grad=True), 1e-6, 0.0)),
    ("gated_residual", lambda: (torch.randn(2, 3, 16, requires_grad=True), torch.randn(2, 3, 16, requires_grad=True),
                                torch.randn(2, 1, 16, requires_grad=True))),
    ("linear_gated_residual", lambda: (torch.randn(2, 3, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True),
                                       torch.randn(8), torch.randn(2, 3, 8, requires_grad=True), torch.randn(8))),
]


@pytest.mark.parametrize("name, make", OPCHECK, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPCHECK)])
def test_opcheck_with_grad(name, make):
    """torch.library's checks with inputs that require grad: the autograd registration and
    AOTAutograd tracing forward and backward (what torch.compile does in training)."""
    torch.library.opcheck(getattr(ops, name).default, make())


def test_gradients_that_are_another_one_are_not_copies():
    """gradient_is (autograd.cpp): fused_add_rms_norm hands x and residual one gradient tensor
    (its backward writes the values once); gated_residual's x and linear_gated_residual's
    residual get the output's incoming gradient itself, not a copy of it."""
    x, res = torch.randn(3, 16, requires_grad=True), torch.randn(3, 16, requires_grad=True)
    out, new_res = ops.fused_add_rms_norm(x, res, None, 1e-6, 0.0)
    dx, dres = torch.autograd.grad([out, new_res], [x, res], grad_outputs=[torch.randn(3, 16), torch.randn(3, 16)])
    assert dx.data_ptr() == dres.data_ptr()
    g = torch.randn(2, 3, 16)
    x, y, gate = (torch.randn(shape, requires_grad=True) for shape in [(2, 3, 16), (2, 3, 16), (2, 1, 16)])
    dx, dy, dgate = torch.autograd.grad(ops.gated_residual(x, y, gate), [x, y, gate], grad_outputs=g)
    assert dx.data_ptr() == g.data_ptr()
    torch.testing.assert_close(dy, g * gate), torch.testing.assert_close(dgate, (g * y).sum(1, keepdim=True))
    w, res, g8 = torch.randn(8, 16, requires_grad=True), torch.randn(2, 3, 8, requires_grad=True), torch.randn(2, 3, 8)
    dres, dw = torch.autograd.grad(ops.linear_gated_residual(x, w, None, res, None), [res, w], grad_outputs=g8)
    assert dres.data_ptr() == g8.data_ptr()
    torch.testing.assert_close(dw, g8.flatten(0, 1).T @ x.flatten(0, 1))


# The arguments whose gradient is another one (gradient_is in schemas.cpp): no grad_<argument>.
GRADIENT_IS = {"fused_add_rms_norm": {"residual"}, "gated_residual": {"x"}, "linear_gated_residual": {"residual"}}


def test_backward_ops_return_a_gradient_per_tensor_argument():
    """Every ``<op>_backward`` returns ``grad_<argument>`` for each tensor argument of ``<op>``,
    in order (one unnamed return for a single one), except the arguments of GRADIENT_IS."""
    names = sorted({s.name.split("::")[1] for s in torch._C._jit_get_all_schemas()
                    if s.name.startswith("ltx_kernels::") and s.name.endswith("_backward")})
    assert "rms_norm_backward" in names and len(names) >= 20
    for name in names:
        forward = name.removesuffix("_backward")
        arguments = [a.name for a in getattr(ops, forward).default._schema.arguments if "Tensor" in str(a.type)]
        expected = [f"grad_{a}" for a in arguments if a not in GRADIENT_IS.get(forward, set())]
        returns = [r.name for r in getattr(ops, name).default._schema.returns]
        assert returns == (expected if len(expected) > 1 else [""]), name


def test_compile_forward_and_backward():
    """torch.compile(fullgraph) traces forward and backward; the gradients match eager."""
    def block(x, w, scale, shift):
        return ops.gelu_tanh(ops.adaln_rms_norm(x, scale, shift, w, 1e-6)).sum()

    args = [torch.randn(2, 5, 32), torch.randn(32), torch.randn(2, 1, 32), torch.randn(32)]
    eager = [a.clone().requires_grad_() for a in args]
    compiled = [a.clone().requires_grad_() for a in args]
    ge = torch.autograd.grad(block(*eager), eager)
    gc = torch.autograd.grad(torch.compile(block, backend="aot_eager", fullgraph=True)(*compiled), compiled)
    for a, b in zip(ge, gc):
        torch.testing.assert_close(a, b)


def test_patched_llama_trains_like_stock():
    """A patched Llama in train mode (every patched op has a backward: RMSNorm, the fused
    residual + norm, SwiGLU, RoPE): every parameter's gradient matches the stock model's, and
    the report says every patched module has a backward."""
    transformers = pytest.importorskip("transformers")
    import copy

    import ltx_kernels.transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    stock = transformers.LlamaForCausalLM(config).train()
    patched = copy.deepcopy(stock)
    report = ltx_kernels.transformers.apply(patched)
    assert any("every patched module has a backward" in n for n in report.notes), report.notes
    ids = torch.randint(0, 64, (2, 7))
    stock(ids, labels=ids).loss.backward()
    patched(ids, labels=ids).loss.backward()
    for (name, p), q in zip(stock.named_parameters(), patched.parameters()):
        assert q.grad is not None, name
        assert_close(q.grad, p.grad, torch.float32, scale=10.0)


@pytest.mark.parametrize("positions", ["interpolation_scale", "video_coords"])
def test_patched_ltx_video_trains_like_stock(positions):
    """A tiny LTX-Video transformer injected in train mode (norms with AdaLN, gated residuals,
    the fused QK-norm + in-kernel RoPE, GELU): every parameter's gradient matches the stock
    model's, and the report says every patched module has a backward."""
    pytest.importorskip("diffusers")
    import copy

    import ltx_kernels.diffusers
    from test_diffusers_ltx import step_kwargs, tiny_model

    stock = tiny_model("cpu", head_dim=12, affine=True).train().requires_grad_(True)
    patched = copy.deepcopy(stock)
    report = ltx_kernels.diffusers.inject(patched)
    assert any("every patched module has a backward" in n for n in report.notes), report.notes
    kw = step_kwargs(stock, positions, per_token=False)
    stock(**kw)[0].square().mean().backward()
    patched(**kw)[0].square().mean().backward()
    # Per parameter, relative L2: stock's RoPE tables take angles of up to 1e4 rad in fp32
    # (~1e-3 rad off), ours reduce them in fp64, so the attention path differs by ~1e-4
    # (each op's gradient is held to the fp64 formula above).
    for (name, p), q in zip(stock.named_parameters(), patched.parameters()):
        assert q.grad is not None, name
        assert rel_err(q.grad, p.grad) < 1e-3, name

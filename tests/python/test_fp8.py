"""The FP8 linear path's ops: quantize_fp8 bit for bit against plain torch, fp8_linear against
the dequantized product (and torch._scaled_mm on the GPU), Meta shapes and bad input."""

import copy
import functools

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, DTYPES, HAS_CUDA, LAYOUTS, TOLERANCE, assert_close, make_rows
from test_elementwise import gelu_tanh_formula

ops = torch.ops.ltx_kernels
FP8 = torch.float8_e4m3fn
# Error of an FP8 tensor-core GEMM's fp32 output, element by element relative to the element
# (plus the same share of the output's rms), for K up to 64: H100 measured 7.5e-5 relative L2
# and 1.2e-4 on the worst element at K = 64, 1.1e-3 of the rms at K = 256 (the accumulator's
# truncation adds up with K, so the bound scales with it; see fp8_accumulator_error).
FP8_ACCUMULATOR_ERROR = 5e-4


def fp8_accumulator_error(k: int) -> float:
    return FP8_ACCUMULATOR_ERROR * max(1.0, k / 64)


def torch_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_fp8's definition in plain torch: each step in fp32, rounding to nearest even."""
    xf = x.float()
    amax = xf.abs().amax(-1).clamp(min=1e-12)  # amax and clamp propagate NaN
    # Tensor / tensor: torch computes 448.0 / t as reciprocal(t) * 448, and on CUDA t / 448.0
    # as t * (1 / 448); each is a second rounding.
    fp8_max = amax.new_tensor(448.0)
    inv = fp8_max / amax
    return (xf * inv[..., None]).to(FP8), amax / fp8_max


def fp8_fused_run(model, kwargs, monkeypatch, fused_modules: tuple[str, ...], gemm_activations=None):
    """One forward of an FP8-injected ``model``, recorded: ``(out, unfused, quantizations,
    GEMM-written residuals, gated_residual passes)``; ``unfused`` is the output of a copy with a
    forward hook on every module whose name ends in one of ``fused_modules`` (each then runs as
    a module: those fusions off). ``gemm_activations``: as :func:`count_quantizations`."""
    from ltx_kernels import _fp8

    with torch.no_grad():
        unfused_model = copy.deepcopy(model)
        for name, m in unfused_model.named_modules():
            if name.endswith(fused_modules):
                m.register_forward_hook(lambda module, args, output: None)
        unfused = unfused_model(**kwargs)[0]
    calls, fused, passes = count_quantizations(monkeypatch, gemm_activations), [], []
    gemm, residual = _fp8.ops.fp8_linear_gated_residual, _fp8.ops.gated_residual
    monkeypatch.setattr(_fp8.ops, "fp8_linear_gated_residual", lambda *args: fused.append(args) or gemm(*args))
    monkeypatch.setattr(_fp8.ops, "gated_residual", lambda *args: passes.append(args) or residual(*args))
    with torch.no_grad():
        out = model(**kwargs)[0]
    return out, unfused, calls, fused, passes


def block_gemms(monkeypatch, model) -> list[tuple[str, int]]:
    """Records each GEMM of ``model``'s block linears (fp8_linear, and F.linear for the linears
    kept in the model's dtype) as (the linear whose weight it starts at, output width)."""
    from ltx_kernels import _fp8

    names = {m.weight.data_ptr(): name for name, m in model.transformer_blocks.named_modules()
             if isinstance(m, torch.nn.Linear)}
    calls = []

    def counting(x, weight, *args, _op, **kwargs):
        if weight.data_ptr() in names:
            calls.append((names[weight.data_ptr()], weight.size(0)))
        return _op(x, weight, *args, **kwargs)

    monkeypatch.setattr(_fp8.ops, "fp8_linear", functools.partial(counting, _op=_fp8.ops.fp8_linear))
    monkeypatch.setattr(torch.nn.functional, "linear", functools.partial(counting, _op=torch.nn.functional.linear))
    return calls


def stored_apart(model) -> None:
    """Gives every block linear its own copies of its weight, scale and bias (as after a user
    replaces them): no group stays adjacent."""
    from ltx_kernels import _fp8

    for m in model.transformer_blocks.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight = torch.nn.Parameter(m.weight.detach().clone(), requires_grad=m.weight.requires_grad)
            if _fp8.is_quantized(m):
                m.weight_scale = m.weight_scale.clone()
            if m.bias is not None:
                m.bias = torch.nn.Parameter(m.bias.detach().clone())


def count_quantizations(monkeypatch, gemm_activations: list | None = None) -> list[str]:
    """Records, through the integrations' ops module, each quantization of an activation: an
    explicit quantize_fp8 (its activation), one inside fp8_linear for a float input, or a
    norm's FP8 output (the norm op's name). ``gemm_activations``, if given, receives the
    activation of each fp8_linear that applies one in its epilogue (a feed-forward's GELU)."""
    from ltx_kernels import _fp8

    calls = []
    quantize, linear = _fp8.ops.quantize_fp8, _fp8.ops.fp8_linear
    for name in ("rms_norm_fp8", "fused_add_rms_norm_fp8", "adaln_rms_norm_fp8", "adaln_layer_norm_fp8",
                 "gated_residual_adaln_rms_norm_fp8"):
        def producer(*args, _op=getattr(_fp8.ops, name), _name=name, **kwargs):
            calls.append(_name)
            return _op(*args, **kwargs)

        monkeypatch.setattr(_fp8.ops, name, producer)

    def counting_quantize(x, activation="none"):
        calls.append(activation)
        return quantize(x, activation)

    def counting_linear(x, *args, x_scale=None, **kwargs):
        if x_scale is None:
            calls.append("none")
        if gemm_activations is not None and kwargs.get("activation", "none") != "none":
            gemm_activations.append(kwargs["activation"])
        return linear(x, *args, x_scale=x_scale, **kwargs)

    monkeypatch.setattr(_fp8.ops, "quantize_fp8", counting_quantize)
    monkeypatch.setattr(_fp8.ops, "fp8_linear", counting_linear)
    return calls


def assert_same_fp8(q: torch.Tensor, scale: torch.Tensor, x: torch.Tensor):
    ref_q, ref_scale = torch_quantize(x)
    assert q.dtype == FP8 and q.shape == x.shape and scale.shape == x.shape[:-1]
    assert torch.equal(scale.cpu().isnan(), ref_scale.cpu().isnan())
    finite = ~ref_scale.cpu().isnan()
    assert torch.equal(scale.cpu()[finite], ref_scale.cpu()[finite])
    # NaN bytes may differ in sign (torch keeps it, the GPU's cvt does not): compare as NaN.
    got, want = q.cpu().float(), ref_q.cpu().float()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(0.0).view(torch.int32), want.nan_to_num(0.0).view(torch.int32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rows, hidden", [(0, 64), (1, 1), (3, 7), (67, 111), (5, 2048), (4, 5125), (2, 16384), (3, 20000)])
def test_quantize_matches_torch_bit_for_bit(device, dtype, layout, rows, hidden):
    x = make_rows(rows, hidden, dtype, device, layout) * 3.0
    q, scale = ltx_kernels.quantize_fp8(x)
    assert_same_fp8(q, scale, x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_special_rows(device, dtype):
    """Zero rows, all-equal rows, tiny and huge values, and rows with inf and NaN."""
    x = torch.randn(8, 96, device=device).to(dtype)
    x[0] = 0
    x[1] = -2.5
    x[2] *= 1e-5
    x[3] *= torch.finfo(dtype).max / 8
    x[4, 7] = float("inf")
    x[5, 3] = float("nan")
    x[6, 0] = -float("inf")
    q, scale = ltx_kernels.quantize_fp8(x)
    assert_same_fp8(q, scale, x)
    assert (q[0].float() == 0).all() and scale[0] > 0
    assert (q[1].float() == -448).all()
    assert q[5].float().isnan().all() and scale[5].isnan()
    assert scale[4].isinf() and q[4, 7].float().isnan() and (q[4].float().nan_to_num(1.0) == 0).sum() == 95


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden", [(1, 1), (7, 111), (67, 2048), (3, 8192), (2, 20000)])
def test_quantize_gelu_tanh_matches_torch(device, dtype, rows, hidden):
    """activation='gelu_tanh': the GELU in fp32, then the same quantization. The GPU's fast
    GELU (~1e-6 relative) may move a value across a rounding boundary: at most one e4m3 step,
    on a tiny fraction of the elements; the CPU reference matches exactly."""
    x = make_rows(rows, hidden, dtype, device, "row_strided") * 3.0
    q, scale = ltx_kernels.quantize_fp8(x, activation="gelu_tanh")
    # The fp64 formula without cancellation: torch's 0.5 x (1 + tanh u) keeps few digits for
    # x < -5, where the reference (and the kernel) are right to the last bit of fp32.
    y = gelu_tanh_formula(x).float()
    if device == "cpu":
        assert_same_fp8(q, scale, y)
        return
    ref_q, ref_scale = torch_quantize(y)
    torch.testing.assert_close(scale, ref_scale, rtol=1e-5, atol=0)
    deq, ref = q.float() * scale[:, None], ref_q.float() * ref_scale[:, None]
    step = ref.abs() * 2.0**-3 + scale[:, None] * 2.0**-9  # one e4m3 step (normal and subnormal)
    assert ((deq - ref).abs() <= step * 1.001).all()
    assert (q.view(torch.uint8) != ref_q.view(torch.uint8)).float().mean() < 1e-3


def test_quantize_unknown_activation():
    with pytest.raises(ValueError, match="quantize_fp8: activation must be 'none' or 'gelu_tanh'"):
        ltx_kernels.quantize_fp8(torch.randn(2, 16), activation="relu")
    with pytest.raises(ValueError, match="quantize_fp8: activation must be"):
        ops.quantize_fp8(torch.randn(2, 16, device="meta"), "relu")


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_round_trip_error_is_e4m3s(device):
    x = torch.randn(64, 512, device=device)
    q, scale = ltx_kernels.quantize_fp8(x)
    err = (q.float() * scale[:, None] - x).abs() / x.abs().amax(-1, keepdim=True)
    assert err.max() <= 2.0**-4  # half an e4m3 step at the top binade, relative to the row max


def dequantized_reference(x, w, bias):
    """The fp8 product in fp64 from the e4m3 values and scales of the quantized operands."""
    qx, sx = torch_quantize(x)
    qw, sw = torch_quantize(w)
    out = (qx.double() * sx.double()[..., None]) @ (qw.double() * sw.double()[:, None]).T
    return out + bias.double() if bias is not None else out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("rows, k, n", [(0, 16, 32), (1, 16, 16), (7, 64, 48), (67, 256, 160)])
def test_fp8_linear_matches_the_dequantized_product(device, dtype, with_bias, rows, k, n):
    x = torch.randn(rows, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype)
    bias = torch.randn(n, device=device, dtype=dtype) if with_bias else None
    qw, sw = ltx_kernels.quantize_fp8(w)
    out = ltx_kernels.fp8_linear(x, qw, sw, bias)
    assert out.dtype == dtype and out.shape == (rows, n)
    if rows:
        # fp32 accumulation over k products, then one rounding: the tolerance of one rounding,
        # with fp32's own share for the summation order; for an fp32 output on the GPU, the
        # FP8 tensor cores' accumulator (about 22 mantissa bits on Hopper) dominates.
        ref = dequantized_reference(x, w, bias)
        if device == "cuda" and dtype == torch.float32:
            rms = ref.norm().item() / ref.numel() ** 0.5
            tol = fp8_accumulator_error(k)
            torch.testing.assert_close(out.double().cpu(), ref.cpu(), rtol=tol, atol=tol * rms)
        else:
            assert_close(out, ref, dtype, scale=2.0)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_linear_batched_and_prequantized(device):
    x = torch.randn(2, 5, 32, device=device, dtype=torch.bfloat16)
    w = torch.randn(16, 32, device=device, dtype=torch.bfloat16)
    qw, sw = ltx_kernels.quantize_fp8(w)
    qx, sx = ltx_kernels.quantize_fp8(x)
    out = ltx_kernels.fp8_linear(qx, qw, sw, x_scale=sx)
    assert out.shape == (2, 5, 16) and out.dtype == torch.bfloat16
    assert torch.equal(out, ltx_kernels.fp8_linear(x, qw, sw))


def assert_gelu_of(out, pre, dtype, rtol, atol):
    """out == gelu_tanh(pre) within the error of pre (rtol of each element, atol absolute; GELU's
    slope is at most 1.13) plus one rounding of out to dtype; in blocks of rows (the fp64
    temporaries of a [16128, 8192] output would take GiBs)."""
    for r in range(0, out.shape[0], 1024):
        o, p = out[r:r + 1024].double(), pre[r:r + 1024]
        ref = gelu_tanh_formula(p)
        bound = 1.13 * (rtol * p.abs() + atol) + torch.finfo(dtype).eps * ref.abs() + torch.finfo(dtype).tiny
        excess = (o - ref).abs() - bound
        assert excess.max().item() <= 0, (r, excess.argmax().item(), excess.max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, n", [(0, 16, 32), (1, 16, 16), (7, 64, 48), (67, 256, 160)])
def test_fp8_linear_gelu_tanh_is_the_gelu_of_its_fp32_result(device, dtype, rows, k, n):
    """activation='gelu_tanh' (a feed-forward's up projection): GELU of the scaled, biased fp32
    result, then the one rounding; every element checked."""
    x = torch.randn(rows, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype) * 4 / k**0.5  # pre-activations of a few units
    bias = torch.randn(n, device=device, dtype=dtype)
    qw, sw = ltx_kernels.quantize_fp8(w)
    out = ltx_kernels.fp8_linear(x, qw, sw, bias, activation="gelu_tanh")
    assert out.dtype == dtype and out.shape == (rows, n)
    pre = dequantized_reference(x, w, bias)
    rms = pre.norm().item() / max(pre.numel(), 1) ** 0.5
    # the plain product's tolerance (test above): fp32's summation order on the CPU, the FP8
    # accumulator on the GPU
    tol = fp8_accumulator_error(k) if device == "cuda" else 2 * TOLERANCE[torch.float32]
    assert_gelu_of(out, pre, dtype, tol, tol * rms)


def test_fp8_linear_activation_and_its_errors():
    x = torch.randn(3, 32)
    qw, sw = ltx_kernels.quantize_fp8(torch.randn(16, 32))
    with pytest.raises(ValueError, match="fp8_linear: activation must be 'none' or 'gelu_tanh', got 'relu'"):
        ltx_kernels.fp8_linear(x, qw, sw, activation="relu")
    with pytest.raises(ValueError, match="fp8_linear: activation must be"):  # the op itself, on Meta
        meta = [t.to("meta") for t in (*ltx_kernels.quantize_fp8(x), qw, sw)]
        ops.fp8_linear(*meta, None, torch.bfloat16, "gelu")
    # 'none' is the plain product, bit for bit
    assert torch.equal(ltx_kernels.fp8_linear(x, qw, sw, activation="none"), ltx_kernels.fp8_linear(x, qw, sw))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, k, n", [(16128, 2048, 8192), (1000, 3072, 3072), (5, 4096, 2048)])
def test_fp8_linear_gelu_tanh_cuda(rows, k, n, dtype):
    """The GELU in our Hopper kernel's epilogue (LTX-2B's up projection at 161 frames) and after
    cuBLASLt's fp32 output (the smaller shapes): each element within the FP8 product's error
    through GELU's slope, plus one rounding."""
    x = torch.randn(rows, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) * 4 / k**0.5
    bias = torch.randn(n, device="cuda", dtype=dtype)
    qx, sx = ltx_kernels.quantize_fp8(x)
    qw, sw = ltx_kernels.quantize_fp8(w)
    out = ltx_kernels.fp8_linear(qx, qw, sw, bias, x_scale=sx, activation="gelu_tanh")
    pre = (qx.double() * sx.double()[:, None]) @ (qw.double() * sw.double()[:, None]).T + bias.double()
    rms = pre.norm().item() / pre.numel() ** 0.5
    assert_gelu_of(out, pre, dtype, fp8_accumulator_error(k), fp8_accumulator_error(k) * rms)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, k, n", [(16128, 2048, 8192), (4111, 8192, 2064), (1000, 3072, 3072),
                                        (333, 5120, 1536), (5, 4096, 2048),
                                        (1163, 256, 16384)])  # >= 4 waves, N of 64 tiles: swizzle 8
def test_fp8_linear_cuda_matches_scaled_mm(rows, k, n, dtype):
    """Large shapes take our Hopper kernel, small ones cuBLASLt (torch._scaled_mm): both within
    one output rounding and the FP8 accumulator's error of the fp64 product, ours no less
    accurate than cuBLASLt's with fast accumulation (torchao's default for FP8 inference on
    CUDA, the anchor; its fp32 output rounded to dtype). Both accumulate in the tensor cores'
    reduced precision: H100 measured 2.0e-3 vs 1.7e-3 for cuBLASLt's promoting path."""
    x = torch.randn(rows, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    qx, sx = ltx_kernels.quantize_fp8(x)
    qw, sw = ltx_kernels.quantize_fp8(w)
    out = ltx_kernels.fp8_linear(qx, qw, sw, bias, x_scale=sx)
    exact = (qx.double() * sx.double()[:, None]) @ (qw.double() * sw.double()[:, None]).T + bias.double()
    one = torch.ones((), device="cuda")
    cublas = (torch._scaled_mm(qx, qw.t(), one, one, out_dtype=torch.float32,
                                use_fast_accum=True).double() * sx.double()[:, None]
              * sw.double()[None, :] + bias.double()).to(dtype)
    rms = exact.norm().item() / exact.numel() ** 0.5
    # The accumulator's error is relative to the element and to the output's rms (as
    # FP8_ACCUMULATOR_ERROR says): its truncation grows with the partial sums.
    rtol = (2.0**-8 if dtype == torch.bfloat16 else 2.0**-11) + fp8_accumulator_error(k)
    torch.testing.assert_close(out.double(), exact, rtol=rtol, atol=fp8_accumulator_error(k) * rms)

    def error(y):
        return ((y.double() - exact).norm() / exact.norm()).item()

    assert error(out) <= 1.1 * error(cublas) + 1e-4


def gated_residual_inputs(device, dtype, b, s, k, n, per_batch=True, strided_gate=False):
    """x quantized [b, s, k], a quantized weight [n, k], bias, residual [b, s, n] and an LTX-like
    gate: a [b, 1, n] row of a [b, 1, 6, n] modulation tensor (strided), or one [n] row, or
    (per_batch=None) none; with strided_gate, every other element of a twice wider one (a
    strided last dim)."""
    qx, sx = ltx_kernels.quantize_fp8(torch.randn(b, s, k, device=device, dtype=dtype))
    qw, sw = ltx_kernels.quantize_fp8(torch.randn(n, k, device=device, dtype=dtype))
    bias = torch.randn(n, device=device, dtype=dtype)
    residual = 4 * torch.randn(b, s, n, device=device, dtype=dtype)
    if per_batch is None:
        return qx, sx, qw, sw, bias, residual, None
    gate = torch.randn(b, 1, 6, n, device=device, dtype=dtype)[:, :, 2] if per_batch else \
        torch.randn(n, device=device, dtype=dtype)
    if strided_gate:
        gate = torch.stack([gate, torch.randn_like(gate)], -1)[..., 0]
    return qx, sx, qw, sw, bias, residual, gate


def gated_residual_formula(qx, sx, qw, sw, bias, residual, gate):
    y = (qx.double() * sx.double()[..., None]) @ (qw.double() * sw.double()[:, None]).T + bias.double()
    return residual.double() + (y if gate is None else gate.double() * y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_batch, strided_gate", [(True, False), (True, True), (False, False), (False, True),
                                                     (None, False)])
@pytest.mark.parametrize("b, s, k, n", [(2, 0, 16, 16), (1, 1, 16, 16), (2, 7, 64, 48), (3, 67, 256, 160)])
def test_fp8_linear_gated_residual_matches_the_formula(device, dtype, per_batch, strided_gate, b, s, k, n):
    args = gated_residual_inputs(device, dtype, b, s, k, n, per_batch, strided_gate)
    out = ltx_kernels.fp8_linear_gated_residual(*args)
    assert out.dtype == dtype and out.shape == (b, s, n) and out.is_contiguous()
    if s:
        # On the GPU the FP8 accumulator's error (relative to the linear's output, which the
        # gate, up to ~4 sigma, multiplies) is coarser than an fp32 output's rounding.
        scale = max(2.0, 4 * fp8_accumulator_error(k) / TOLERANCE[dtype]) if device == "cuda" else 2.0
        assert_close(out, gated_residual_formula(*args), dtype, scale=scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b, s, k, n", [(1, 5, 48, 32), (2, 67, 256, 160), (2, 1333, 1024, 1536)])
def test_fp8_linears_read_a_column_block_of_a_weight_in_place(device, b, s, k, n):
    """fp8_linear and fp8_linear_gated_residual on ``w[:, a:b]`` (rows contiguous, the wider
    weight's row stride; FLUX's proj_out split in two) give exactly what they give on a copy of
    that block: the same operands, read with another stride (on Hopper, by our kernel's TMA)."""
    qx, sx, qw, sw, bias, residual, gate = gated_residual_inputs(device, torch.bfloat16, b, s, k, n)
    wide = torch.cat([ltx_kernels.quantize_fp8(torch.randn(n, 32, device=device))[0], qw,
                      ltx_kernels.quantize_fp8(torch.randn(n, 16, device=device))[0]], -1)
    block = wide[:, 32:32 + k]
    assert not block.is_contiguous() and torch.equal(block.view(torch.uint8), qw.view(torch.uint8))
    assert torch.equal(ltx_kernels.fp8_linear(qx, block, sw, bias, x_scale=sx),
                       ltx_kernels.fp8_linear(qx, qw, sw, bias, x_scale=sx))
    assert torch.equal(ltx_kernels.fp8_linear_gated_residual(qx, sx, block, sw, bias, residual, gate),
                       ltx_kernels.fp8_linear_gated_residual(qx, sx, qw, sw, bias, residual, gate))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b, s, k, n, per_batch, strided_gate", [
    (2, 2688, 2048, 2048, True, False), (2, 2688, 8192, 2048, True, False), (1, 8064, 2048, 2048, True, False),
    (3, 1333, 1040, 528, True, False), (2, 5, 4096, 2048, True, False), (2, 2688, 2048, 2048, True, True),
    (2, 2311, 256, 4096, True, True),  # >= 4 waves of tiles: the residual form's swizzle 8
    (2, 2688, 2048, 2048, None, False), (3, 1333, 1040, 528, None, False)])  # no gate
def test_fp8_linear_gated_residual_cuda_is_no_worse_than_its_parts(dtype, b, s, k, n, per_batch, strided_gate):
    """Our Hopper kernel (one GEMM per sample batch, the residual read and written by its
    epilogue, at every size; no gate: ones, the gate row pointer null): within one output
    rounding and the FP8 accumulator's error of the fp64 formula, and no less accurate than the
    unfused fp8_linear then gated_residual (which rounds the linear's output once more) where
    that fp8_linear runs our kernel too."""
    args = gated_residual_inputs("cuda", dtype, b, s, k, n, per_batch, strided_gate)
    qx, sx, qw, sw, bias, residual, gate = args
    out = ltx_kernels.fp8_linear_gated_residual(*args)
    exact = gated_residual_formula(*args)
    y = (qx.double() * sx.double()[..., None]) @ (qw.double() * sw.double()[:, None]).T + bias.double()
    rms_y = y.norm().item() / y.numel() ** 0.5
    rtol = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    # x2: the worst of up to millions of elements, where fp8_accumulator_error is a typical one (H100: one element
    # in 2.1M at 1.44x it, 3 x 1333 x 528 at K = 1040 in fp16, whose rtol leaves no room).
    atol = 2 * fp8_accumulator_error(k) * rms_y * (1.0 if gate is None else gate.abs().max().item())
    torch.testing.assert_close(out.double(), exact, rtol=rtol, atol=atol)
    # gated_residual takes a gate with a contiguous last dim only (a clear error otherwise).
    unfused = ltx_kernels.gated_residual(residual, ltx_kernels.fp8_linear(qx, qw, sw, bias, x_scale=sx),
                                         None if gate is None else gate.contiguous())

    def error(t):
        return ((t.double() - exact).norm() / exact.norm()).item()

    # Under two waves of 128 x 128 tiles the plain fp8_linear takes cuBLASLt's GEMM, which
    # promotes its accumulator to fp32: no bar for our FP8 accumulator (the bound above holds).
    tiles = -(-b * s // 128) * -(-n // 128)
    if tiles >= 2 * torch.cuda.get_device_properties(qx.device).multi_processor_count:
        assert error(out) <= 1.05 * error(unfused) + 1e-5


def test_meta_shapes():
    x = torch.empty(2, 7, 32, device="meta", dtype=torch.bfloat16)
    q, s = ops.quantize_fp8(x)
    assert q.shape == x.shape and q.dtype == FP8 and s.shape == (2, 7) and s.dtype == torch.float32
    w = torch.empty(48, 32, device="meta", dtype=FP8)
    out = ops.fp8_linear(q, s, w, torch.empty(48, device="meta"), None, torch.bfloat16)
    assert out.shape == (2, 7, 48) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_input_names_the_argument(device):
    x = torch.randn(3, 32, device=device)
    q, s = ops.quantize_fp8(torch.randn(3, 32, device=device))
    w, ws = ops.quantize_fp8(torch.randn(48, 32, device=device))
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16"):
        ops.quantize_fp8(torch.randint(0, 3, (3, 32), device=device))
    with pytest.raises(TypeError, match="fp8_linear: x and weight must be float8_e4m3fn"):
        ops.fp8_linear(x, s, w, ws, None, torch.bfloat16)
    with pytest.raises(ValueError, match="x_scale must have x's shape"):
        ops.fp8_linear(q, s[:2], w, ws, None, torch.bfloat16)
    with pytest.raises(ValueError, match="weight_scale must be"):
        ops.fp8_linear(q, s, w, ws[:5], None, torch.bfloat16)
    with pytest.raises(ValueError, match="weight must be \\[N, K\\]"):
        ops.fp8_linear(q, s, w[:, :16], ws, None, torch.bfloat16)
    q7, s7 = ops.quantize_fp8(torch.randn(3, 24, device=device))
    w7, ws7 = ops.quantize_fp8(torch.randn(48, 24, device=device))
    with pytest.raises(ValueError, match="multiples of 16"):
        ops.fp8_linear(q7, s7, w7, ws7, None, torch.bfloat16)
    with pytest.raises(TypeError, match="bias must have out_dtype"):
        ops.fp8_linear(q, s, w, ws, torch.randn(48, device=device), torch.bfloat16)
    with pytest.raises(TypeError, match="out_dtype must be"):
        ops.fp8_linear(q, s, w, ws, None, torch.int32)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_fp8_linear_gated_residual_bad_input_names_the_argument(device):
    qx, sx, qw, sw, bias, residual, gate = gated_residual_inputs(device if device == "cpu" else "cpu",
                                                                 torch.bfloat16, 2, 5, 32, 48)
    qx, sx, qw, sw, bias, residual, gate = (t.to(device) for t in (qx, sx, qw, sw, bias, residual, gate))
    op = ops.fp8_linear_gated_residual
    assert op(qx, sx, qw, sw, bias, residual, gate).shape == (2, 5, 48)
    assert op(qx, sx, qw, sw, bias, residual, None).shape == (2, 5, 48)  # no gate
    with pytest.raises(ValueError, match=r"fp8_linear_gated_residual: gate must be \[B, 1, N\] or \[N\].*per-token"):
        op(qx, sx, qw, sw, bias, residual, residual)  # a per-token gate
    with pytest.raises(ValueError, match="fp8_linear_gated_residual: x must be \\[B, S, K\\]"):
        op(qx[0], sx[0], qw, sw, bias, residual[0], gate[0, 0])
    with pytest.raises(ValueError, match="fp8_linear_gated_residual: residual must be \\[B, S, N\\]"):
        op(qx, sx, qw, sw, bias, residual[:, :4], gate)
    with pytest.raises(TypeError, match="fp8_linear_gated_residual: gate must have residual's dtype"):
        op(qx, sx, qw, sw, bias, residual, gate.float())
    with pytest.raises(TypeError, match="fp8_linear_gated_residual: residual must be float32, float16 or bfloat16"):
        op(qx, sx, qw, sw, bias, residual.double(), gate)
    with pytest.raises(TypeError, match="bias must have out_dtype"):
        op(qx, sx, qw, sw, bias.float(), residual, gate)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    w = torch.randn(32, 64, device=device)
    qw, sw = ltx_kernels.quantize_fp8(w)

    def f(x):
        return ltx_kernels.fp8_linear(x * 2, qw, sw) + 1

    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    x = torch.randn(5, 64, device=device)
    assert torch.equal(torch.compile(f, fullgraph=True, backend=backend)(x), f(x))

    def g(x, residual, gate):
        return ltx_kernels.fp8_linear_gated_residual(*ltx_kernels.quantize_fp8(x), qw, sw, None, residual * 2, gate)

    torch._dynamo.reset()
    x, residual, gate = (torch.randn(*shape, device=device) for shape in ((2, 3, 64), (2, 3, 32), (2, 1, 32)))
    assert torch.equal(torch.compile(g, fullgraph=True, backend=backend)(x, residual, gate), g(x, residual, gate))

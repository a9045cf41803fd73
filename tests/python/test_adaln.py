"""AdaLN modulation and the gated residual fused with the next norm (DiT blocks)."""

import pytest
import torch
import torch.nn.functional as F

import ltx_kernels
from conftest import DEVICES, DTYPES, HAS_CUDA, assert_close
from test_rms_norm import rms_norm_formula

ops = torch.ops.ltx_kernels


def modulation(kind, b, s, d, dtype, device):
    """(scale, shift) in one of the broadcast forms a DiT passes."""
    if kind == "vector":
        return torch.randn(d, dtype=dtype, device=device), torch.randn(d, dtype=dtype, device=device)
    if kind == "per_batch":
        return (torch.randn(b, 1, d, dtype=dtype, device=device),
                torch.randn(b, 1, d, dtype=dtype, device=device))
    if kind == "per_token":
        return (torch.randn(b, s, d, dtype=dtype, device=device),
                torch.randn(b, s, d, dtype=dtype, device=device))
    if kind == "ltx_unbind":
        # LTX: ada = table + temb.reshape(B, S, 6, D); shift, scale, gate, ... = ada.unbind(2)
        ada = torch.randn(b, s, 6, d, dtype=dtype, device=device)
        return ada[:, :, 1], ada[:, :, 0]
    if kind == "ltx_unbind_per_batch":
        ada = torch.randn(b, 1, 6, d, dtype=dtype, device=device)
        return ada[:, :, 1], ada[:, :, 0]
    raise ValueError(kind)


KINDS = ["vector", "per_batch", "per_token", "ltx_unbind", "ltx_unbind_per_batch"]


def modulate(y, scale, shift):
    return y * (1 + scale.double()) + shift.double()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b,s,d", [(2, 7, 64), (1, 1, 8), (3, 5, 2048), (2, 3, 111), (1, 2, 4104)])
@pytest.mark.parametrize("with_weight", [False, True])
def test_adaln_rms_norm(device, dtype, kind, b, s, d, with_weight):
    x = torch.randn(b, s, d, dtype=dtype, device=device)
    scale, shift = modulation(kind, b, s, d, dtype, device)
    weight = torch.randn(d, dtype=dtype, device=device) if with_weight else None
    out = ltx_kernels.adaln_rms_norm(x, scale, shift, weight, 1e-6)
    assert_close(out, modulate(rms_norm_formula(x, weight), scale, shift), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b,s,d", [(2, 7, 64), (3, 5, 2048), (2, 3, 111)])
def test_adaln_layer_norm(device, dtype, kind, b, s, d):
    x = torch.randn(b, s, d, dtype=dtype, device=device) + 2.0
    scale, shift = modulation(kind, b, s, d, dtype, device)
    ref = modulate(F.layer_norm(x.double(), (d,), eps=1e-6), scale, shift)
    assert_close(ltx_kernels.adaln_layer_norm(x, scale, shift, None, None, 1e-6), ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b,s,d", [(2, 7, 64), (3, 5, 2048), (2, 3, 111), (1, 2, 4104)])
@pytest.mark.parametrize("gated", [True, False])
def test_gated_residual_adaln_rms_norm(device, dtype, kind, b, s, d, gated):
    x = torch.randn(b, s, d, dtype=dtype, device=device)
    y = torch.randn(b, s, d, dtype=dtype, device=device)
    scale, shift = modulation(kind, b, s, d, dtype, device)
    gate = modulation(kind, b, s, d, dtype, device)[0] if gated else None
    x_new, normed = ltx_kernels.gated_residual_adaln_rms_norm(x, y, gate, scale, shift, None, 1e-6)
    expected = x.float() + y.float() * (gate.float() if gated else 1.0)
    assert_close(x_new, expected, dtype)
    # The norm is of the returned (rounded) x_new, as the next sub-layer would see it.
    assert_close(normed, modulate(rms_norm_formula(x_new), scale, shift), dtype)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d", [64, 111, 2048, 4096, 20000])
def test_cuda_matches_cpu_reference(dtype, kind, d):
    b, s = 2, 9
    x = torch.randn(b, s, d, dtype=dtype, device="cuda")
    y = torch.randn(b, s, d, dtype=dtype, device="cuda")
    scale, shift = modulation(kind, b, s, d, dtype, "cuda")
    gate = modulation(kind, b, s, d, dtype, "cuda")[1]
    w = torch.randn(d, dtype=dtype, device="cuda")
    cpu = lambda t: t.cpu()  # noqa: E731
    out = ltx_kernels.adaln_rms_norm(x, scale, shift, w)
    assert_close(out, ltx_kernels.adaln_rms_norm(cpu(x), cpu(scale), cpu(shift), cpu(w)), dtype)
    out = ltx_kernels.adaln_layer_norm(x, scale, shift, w, w)
    assert_close(out, ltx_kernels.adaln_layer_norm(cpu(x), cpu(scale), cpu(shift), cpu(w), cpu(w)), dtype)
    x_new, normed = ltx_kernels.gated_residual_adaln_rms_norm(x, y, gate, scale, shift, w)
    ref_new, ref_normed = ltx_kernels.gated_residual_adaln_rms_norm(
        cpu(x), cpu(y), cpu(gate), cpu(scale), cpu(shift), cpu(w))
    assert torch.equal(x_new.cpu(), ref_new)
    assert_close(normed, ref_normed, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    b, s, d = 2, 5, 64
    x, y = torch.randn(b, s, d, device=device), torch.randn(b, s, d, device=device)
    ada = torch.randn(b, s, 6, d, device=device)
    shift, scale, gate = ada[:, :, 0], ada[:, :, 1], ada[:, :, 2]
    torch.library.opcheck(ops.adaln_rms_norm.default, (x, scale, shift, None, 1e-6))
    torch.library.opcheck(ops.adaln_layer_norm.default, (x, scale, shift, None, None, 1e-6))
    torch.library.opcheck(ops.gated_residual_adaln_rms_norm.default, (x, y, gate, scale, shift, None, 1e-6))

    def block(x, y, ada):
        shift, scale, gate = ada.unbind(2)[:3]
        n = ltx_kernels.adaln_rms_norm(x, scale, shift)
        return ltx_kernels.gated_residual_adaln_rms_norm(x, n * y, gate, scale, shift)

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for s2 in (5, 9):
        x, y = torch.randn(b, s2, d, device=device), torch.randn(b, s2, d, device=device)
        ada = torch.randn(b, s2, 6, d, device=device)
        for got, want in zip(compiled(x, y, ada), block(x, y, ada)):
            assert_close(got, want, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_modulation_names_the_argument(device):
    x = torch.randn(2, 5, 64, device=device)
    good = torch.randn(64, device=device)
    cases = [
        ("scale must have shape", lambda: ltx_kernels.adaln_rms_norm(x, torch.randn(63, device=device), good)),
        ("shift must have shape", lambda: ltx_kernels.adaln_rms_norm(x, good, torch.randn(2, 4, 64, device=device))),
        ("scale must have shape", lambda: ltx_kernels.adaln_rms_norm(x, torch.randn(3, 1, 64, device=device), good)),
        ("scale must have the dtype of x", lambda: ltx_kernels.adaln_rms_norm(x, good.half(), good)),
        ("shift must have a contiguous last dim", lambda: ltx_kernels.adaln_rms_norm(x, good, torch.randn(2, 64, 5, device=device).transpose(1, 2))),
        ("gate must have shape", lambda: ltx_kernels.gated_residual_adaln_rms_norm(x, x, torch.randn(5, device=device), good, good)),
        ("y must have the shape of x", lambda: ltx_kernels.gated_residual_adaln_rms_norm(x, x[:1], None, good, good)),
    ]
    for message, call in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            call()


@pytest.mark.parametrize("old, new", [
    (ltx_kernels.rmsnorm, ltx_kernels.rms_norm),
    (ltx_kernels.rmsnorm_residual, ltx_kernels.fused_add_rms_norm),
    (ltx_kernels.adaln_rmsnorm, ltx_kernels.adaln_rms_norm),
    (ltx_kernels.adaln_layernorm, ltx_kernels.adaln_layer_norm),
], ids=lambda f: f.__name__)
def test_old_names_take_the_defaults_of_the_function_they_alias(old, new):
    """Each argument the two share (by name) has one default (the old names' ``weight``
    before ``scale`` is positional, so it has none there)."""
    import inspect

    old_params, new_params = (inspect.signature(f).parameters for f in (old, new))
    shared = {name for name in set(old_params) & set(new_params)
              if old_params[name].default is not inspect.Parameter.empty}
    assert "eps" in shared
    for name in shared:
        assert old_params[name].default == new_params[name].default, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_old_names(device, dtype):
    """adaln_rmsnorm / adaln_layernorm / adaln_zero of the original package, [B, D]
    modulation included, and their out= argument."""
    b, s, d = 2, 5, 96
    x = torch.randn(b, s, d, dtype=dtype, device=device)
    w = torch.randn(d, dtype=dtype, device=device)
    bias = torch.randn(d, dtype=dtype, device=device)
    scale, shift, gate = (torch.randn(b, d, dtype=dtype, device=device) for _ in range(3))
    sc, sh, g = scale[:, None].double(), shift[:, None].double(), gate[:, None].double()
    rms = rms_norm_formula(x, w)
    assert_close(ltx_kernels.adaln_rmsnorm(x, w, scale, shift), rms * (1 + sc) + sh, dtype)
    ln = F.layer_norm(x.double(), (d,), w.double(), bias.double(), 1e-6)  # adaln_layer_norm's default
    assert_close(ltx_kernels.adaln_layernorm(x, w, scale, shift, bias), ln * (1 + sc) + sh, dtype)
    out = torch.full_like(x, float("nan"))
    assert ltx_kernels.adaln_zero(x, w, scale, shift, gate, out=out) is out
    # Two roundings (the modulated norm, then the gate product).
    assert_close(out, (rms * (1 + sc) + sh) * g, dtype, scale=2.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_out_overloads_write_in_place(device, dtype):
    """adaln_rmsnorm / adaln_layernorm with out= run the ops' .out overloads: the kernel writes
    into out (no copy), the same values as without it."""
    b, s, d = 2, 7, 72
    x = torch.randn(b, s, d, dtype=dtype, device=device)
    w, bias = (torch.randn(d, dtype=dtype, device=device) for _ in range(2))
    scale, shift = (torch.randn(b, d, dtype=dtype, device=device) for _ in range(2))
    for fn, args in ((ltx_kernels.adaln_rmsnorm, (x, w, scale, shift)),
                     (ltx_kernels.adaln_layernorm, (x, w, scale, shift, bias))):
        out = torch.full_like(x, float("nan"))
        assert fn(*args, out=out) is out
        assert torch.equal(out, fn(*args)), fn.__name__


def test_out_overloads_check_out():
    x = torch.randn(2, 3, 16)
    scale, shift = torch.randn(16), torch.randn(16)
    cases = [
        ("adaln_rms_norm: out must have the shape of x", torch.empty(2, 3, 8)),
        ("adaln_rms_norm: out must have the dtype of x", torch.empty(2, 3, 16, dtype=torch.float64)),
        ("adaln_rms_norm: out must be contiguous", torch.empty(2, 16, 3).transpose(1, 2)),
    ]
    for message, out in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            ops.adaln_rms_norm.out(x, scale, shift, None, 1e-6, out=out)
    with pytest.raises(ValueError, match="adaln_layer_norm: out is written while x is read, and their memory"):
        ops.adaln_layer_norm.out(x, scale, shift, None, None, 1e-6, out=x)
    buffer = torch.empty(2, 3, 16)
    with pytest.raises(ValueError, match="adaln_rms_norm: out is written while shift is read"):
        ops.adaln_rms_norm.out(x, scale, buffer[1, 2], None, 1e-6, out=buffer)
    with pytest.raises(RuntimeError, match="adaln_rms_norm.out"):  # forward-only, as every out= form
        ops.adaln_rms_norm.out(x.requires_grad_(), scale, shift, None, 1e-6, out=torch.empty(2, 3, 16))


def test_out_overloads_opcheck_and_meta():
    x = torch.randn(2, 3, 16)
    scale, shift, w, bias = (torch.randn(16) for _ in range(4))
    torch.library.opcheck(ops.adaln_rms_norm.out, (x, scale, shift, w, 1e-6), {"out": torch.empty_like(x)})
    torch.library.opcheck(ops.adaln_layer_norm.out, (x, scale, shift, w, bias, 1e-6), {"out": torch.empty_like(x)})
    meta = x.to("meta")
    ops.adaln_rms_norm.out(meta, scale.to("meta"), shift.to("meta"), None, 1e-6, out=torch.empty_like(meta))
    with pytest.raises(ValueError, match="adaln_rms_norm: out must have the shape of x"):
        ops.adaln_rms_norm.out(meta, scale.to("meta"), shift.to("meta"), None, 1e-6,
                               out=torch.empty(2, 16, device="meta"))

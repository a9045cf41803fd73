"""Training under torch.compile runs the cheap ops as their formulas (ltx_kernels._compile_formulas).

Each op, compiled (fullgraph) with inputs that require grad: its outputs and every input's
gradient match our op's eager forward and backward, for each dtype, odd sizes, strided x and
each broadcast form of scale / shift / gate; the compiled code calls no op of ours (Inductor got
the formula) but the same call without grad does (inference keeps our kernel); and a bad input
still raises our op's message while tracing.
"""

import pytest
import torch
from conftest import DEVICES, DTYPES, assert_close
from torch._inductor.utils import run_and_get_code

from ltx_kernels import ops

B, S, D = 2, 5, 24  # odd sizes; D even for the concatenated GLUs


def _x(dtype, device, strided=False, d=D):
    if strided:  # rows of a wider tensor
        return torch.randn(B, S, 3 * d, dtype=dtype, device=device)[..., d : 2 * d].requires_grad_()
    return torch.randn(B, S, d, dtype=dtype, device=device, requires_grad=True)


def _vec(shape, dtype, device):
    return (0.5 * torch.randn(*shape, dtype=dtype, device=device)).requires_grad_()


ROW_VECTOR_SHAPES = {"per_dim": (D,), "per_batch": (B, 1, D), "per_token": (B, S, D)}


def cases(dtype, device, strided, vector):
    """(name, op call, tensor inputs) for every op with a formula."""
    shape = ROW_VECTOR_SHAPES[vector]
    x, y = _x(dtype, device, strided), _x(dtype, device)
    scale, shift, gate = (_vec(shape, dtype, device) for _ in range(3))
    w = (1.0 + 0.3 * torch.randn(D, dtype=dtype, device=device)).requires_grad_()
    w32 = (1.0 + 0.3 * torch.randn(D, device=device)).requires_grad_()  # an fp32 weight beside 16-bit x
    bias = _vec((D,), dtype, device)
    a, b = _x(dtype, device, strided), _x(dtype, device)
    cat = _x(dtype, device, strided, d=2 * D)
    return [
        ("rms_norm", lambda x, w: ops.rms_norm(x, w, 1e-5), (x, w)),
        ("rms_norm fp32 weight, offset", lambda x, w: ops.rms_norm(x, w, 1e-6, weight_offset=1.0), (x, w32)),
        ("rms_norm no weight, fp32 out", lambda x: ops.rms_norm(x, None, out_dtype=torch.float32), (x,)),
        ("fused_add_rms_norm", lambda x, r, w: ops.fused_add_rms_norm(x, r, w), (x, y, w)),
        ("layer_norm", lambda x, w, b: ops.layer_norm(x, w, b), (x, w, bias)),
        ("adaln_rms_norm", lambda x, s, t, w: ops.adaln_rms_norm(x, s, t, w), (x, scale, shift, w)),
        ("adaln_layer_norm", lambda x, s, t: ops.adaln_layer_norm(x, s, t), (x, scale, shift)),
        ("gated_residual", lambda x, y, g: ops.gated_residual(x, y, g), (x, y, gate)),
        ("gated_residual no gate", lambda x, y: ops.gated_residual(x, y), (x, y)),
        ("gated_residual_adaln_rms_norm",
         lambda x, y, g, s, t, w: ops.gated_residual_adaln_rms_norm(x, y, g, s, t, w), (x, y, gate, scale, shift, w)),
        ("gelu_tanh", lambda a: ops.gelu_tanh(a), (a,)),
        ("gelu_tanh_and_mul", lambda a, b: ops.gelu_tanh_and_mul(a, b), (a, b)),
        ("gelu_and_mul", lambda a, b: ops.gelu_and_mul(a, b), (a, b)),
        ("silu_and_mul", lambda a, b: ops.silu_and_mul(a, b), (a, b)),
        ("geglu tanh", lambda c: ops.geglu(c), (cat,)),
        ("geglu erf", lambda c: ops.geglu(c, approximate="none"), (cat,)),
        ("swiglu", lambda c: ops.swiglu(c), (cat,)),
    ]


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def _forward_backward(fn, inputs, grads):
    outs = _outputs(fn(*inputs))
    if grads is None:
        grads = [torch.randn_like(o) for o in outs]
    return outs, torch.autograd.grad(outs, inputs, grads), grads


def _ours_in(code: list[str]) -> bool:
    return any("ltx_kernels" in c for c in code)


# each layout of x with one broadcast form (every op compiles once per case: CI time)
LAYOUTS = [(False, "per_batch"), (True, "per_dim"), (False, "per_token")]


@pytest.mark.parametrize("strided,vector", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_training_matches_our_op(device, dtype, strided, vector):
    torch.manual_seed(0)
    for name, fn, inputs in cases(dtype, device, strided, vector):
        ours, ours_grads, grads = _forward_backward(fn, inputs, None)
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, dynamic=False)
        (outs, got_grads, _), code = run_and_get_code(lambda: _forward_backward(compiled, inputs, grads))
        assert not _ours_in(code), f"{name}: the compiled training step still calls our op"
        for got, want in zip(outs, ours):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert_close(got, want, dtype)
        for t, got, want in zip(inputs, got_grads, ours_grads):
            assert got.dtype == t.dtype, name
            # a row-vector gradient sums B * S terms (and the fp32 weight's of rounded ones)
            assert_close(got, want, dtype, scale=4.0 if got.dim() < 3 else 1.0)


def test_compiled_inference_keeps_our_kernels():
    x, y, gate = (torch.randn(B, S, D) for _ in range(3))
    compiled = torch.compile(lambda x, y, g: ops.gated_residual(x, y, g), fullgraph=True)
    with torch.no_grad():
        out, code = run_and_get_code(compiled, x, y, gate)
    assert _ours_in(code)
    assert torch.equal(out, ops.gated_residual(x, y, gate))
    # inputs that need no grad, with grad mode on: no backward to fuse either
    torch._dynamo.reset()
    out, code = run_and_get_code(torch.compile(lambda x: ops.rms_norm(x), fullgraph=True), x)
    assert _ours_in(code)


def test_bad_input_still_raises_our_message_under_compiled_training():
    x = torch.randn(B, S, D, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, g: ops.gated_residual(x, x, g), fullgraph=True)
    with pytest.raises(Exception, match=r"gate must have shape \[D\], \[B, 1, D\]"):
        compiled(x, torch.randn(D + 1))

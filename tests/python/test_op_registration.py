"""The ops as PyTorch operators: opcheck, torch.compile(fullgraph=True), bad input."""

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, HAS_CUDA, assert_close

ops = torch.ops.ltx_kernels


def norm_cases(device, dtype=torch.float32):
    x = torch.randn(3, 5, 64, dtype=dtype, device=device)
    r = torch.randn(3, 5, 64, dtype=dtype, device=device)
    w = torch.randn(64, dtype=dtype, device=device)
    b = torch.randn(64, dtype=dtype, device=device)
    return [
        (ops.rms_norm.default, (x, w, 1e-6, 0.0)),
        (ops.rms_norm.default, (x, None, 1e-6, 0.0)),
        (ops.fused_add_rms_norm.default, (x, r, w, 1e-6, 1.0)),
        (ops.fused_add_rms_norm_.default, (x, r.clone(), w, 1e-6, 0.0)),
        (ops.layer_norm.default, (x, w, b, 1e-5)),
        (ops.layer_norm.default, (x, None, None, 1e-5)),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(6))
def test_opcheck(device, case):
    op, args = norm_cases(device)[case]
    torch.library.opcheck(op, args)


def decoder_like(x, residual, w_rms, w_ln, b_ln):
    """Eager code mixing our ops with torch ops, as a patched model would."""
    h = ltx_kernels.rms_norm(x * 2.0, w_rms, 1e-6)
    out, residual = ltx_kernels.fused_add_rms_norm(h, residual, w_rms, 1e-6)
    return ltx_kernels.layer_norm(out + 1.0, w_ln, b_ln, 1e-5), residual


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(device, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(decoder_like, fullgraph=True, dynamic=dynamic)
    for rows in (6, 10):  # a second shape exercises recompilation / symbolic shapes
        args = [torch.randn(rows, 128, device=device), torch.randn(rows, 128, device=device)]
        args += [torch.randn(128, device=device) for _ in range(3)]
        out, residual = compiled(*args)
        ref_out, ref_residual = decoder_like(*args)
        assert_close(out, ref_out, torch.float32)
        assert torch.equal(residual, ref_residual)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_in_place(device):
    torch._dynamo.reset()

    def step(x, residual, w):
        return ltx_kernels.fused_add_rms_norm_(x, residual, w, 1e-6)

    compiled = torch.compile(step, fullgraph=True)
    x, w = torch.randn(4, 64, device=device), torch.randn(64, device=device)
    residual = torch.randn(4, 64, device=device)
    expected_residual = x + residual
    out = compiled(x, residual, w)
    assert torch.equal(residual, expected_residual)
    assert_close(out, ltx_kernels.rms_norm(expected_residual, w, 1e-6), torch.float32)


def bad_inputs(device):
    """(op, message, call): each message must start with its op's name, once, whether the
    op's own check raised it or a shared one (registration.h's NamedKernel)."""
    x = torch.randn(4, 64, device=device)
    w = torch.randn(64, device=device)
    return [
        ("rms_norm", "x must be float32", lambda: ltx_kernels.rms_norm(x.double(), None)),
        ("rms_norm", "x must be float32", lambda: ltx_kernels.rms_norm(x.int(), None)),
        ("rms_norm", "x must have at least 1 dim", lambda: ltx_kernels.rms_norm(torch.tensor(1.0, device=device), None)),
        ("rms_norm", "x must have a contiguous last dim", lambda: ltx_kernels.rms_norm(x.t(), None)),
        ("rms_norm", "weight must have shape", lambda: ltx_kernels.rms_norm(x, torch.randn(63, device=device))),
        ("rms_norm", "weight must have shape", lambda: ltx_kernels.rms_norm(x, torch.randn(2, 64, device=device))),
        ("rms_norm", "weight must have the dtype of x", lambda: ltx_kernels.rms_norm(x, w.half())),
        ("rms_norm", "eps must be >= 0", lambda: ltx_kernels.rms_norm(x, w, -1.0)),
        ("fused_add_rms_norm", "residual must have the shape of x", lambda: ltx_kernels.fused_add_rms_norm(x, x[:3], w)),
        ("fused_add_rms_norm", "residual must have the dtype of x",
         lambda: ltx_kernels.fused_add_rms_norm(x, x.bfloat16(), w)),
        ("layer_norm", "bias must have shape", lambda: ltx_kernels.layer_norm(x, w, torch.randn(65, device=device))),
        ("layer_norm", "bias must have the dtype of x", lambda: ltx_kernels.layer_norm(x, w, w.bfloat16())),
        ("gated_residual", "y must have the shape of x", lambda: ltx_kernels.gated_residual(x, x[:, :32])),
        ("silu_and_mul", "b must have the dtype of a", lambda: ltx_kernels.silu_and_mul(x, x.half())),
        ("gelu_and_mul", "b must have the shape of a", lambda: ltx_kernels.gelu_and_mul(x, x[:3])),
        ("quantize_fp8", "x must be float32", lambda: ltx_kernels.quantize_fp8(x.int())),
    ]


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("case", range(16))
def test_bad_input_names_the_op_and_the_argument(device, case):
    op, message, call = bad_inputs(device)[case]
    with pytest.raises((ValueError, TypeError), match=f"^{op}: {message}"):
        call()


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_device_mismatch_names_the_argument():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(ValueError, match="weight must be on the device of x"):
        ltx_kernels.rms_norm(x, torch.randn(64))
    with pytest.raises(ValueError, match="residual must be on the device of x"):
        ltx_kernels.fused_add_rms_norm(x, torch.randn(4, 64), None)


def test_bad_input_under_compile_names_the_argument():
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: ltx_kernels.rms_norm(x, w), fullgraph=True)
    with pytest.raises(Exception, match="weight must have shape"):
        compiled(torch.randn(4, 64), torch.randn(32))


def test_checker_catches_one_corrupted_element():
    """The tolerance check fails on a single wrong element in the last row's tail, which the
    relative L2 error of a large bf16 output alone would pass."""
    x = torch.randn(67, 16384, dtype=torch.bfloat16)
    w = torch.randn(16384, dtype=torch.bfloat16)
    out = ltx_kernels.rms_norm(x, w, 1e-6)
    ref = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)) * w.double()
    assert_close(out, ref, torch.bfloat16)
    out[-1, -1] = -out[-1, -1] + 3.0
    with pytest.raises(AssertionError, match=r"element \[66, 16383\]"):
        assert_close(out, ref, torch.bfloat16)

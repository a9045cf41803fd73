"""linear_gated_residual against the PyTorch formula (fp64) and the unfused linear +
gated_residual: shapes that reach the Hopper kernel's tile and batch edges, the fallback's
shapes, every gate form, strided and misaligned operands, gradients."""

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, DTYPES, HAS_CUDA, TOLERANCE, assert_close, rel_err

ops = torch.ops.ltx_kernels


def inputs(b, s, k, n, dtype, device, gate="batch", bias=True):
    x = torch.randn(b, s, k, dtype=dtype, device=device)
    weight = torch.randn(n, k, dtype=dtype, device=device) / k**0.5
    residual = torch.randn(b, s, n, dtype=dtype, device=device)
    if gate == "batch":
        g = torch.randn(b, 1, n, dtype=dtype, device=device)
    elif gate == "vector":
        g = torch.randn(n, dtype=dtype, device=device)
    elif gate == "modulation":  # LTX's: a [B, 1, N] view of a [B, 1, 6, N] modulation tensor
        g = torch.randn(b, 1, 6, n, dtype=dtype, device=device)[:, :, 2]
    else:
        g = None
    return x, weight, torch.randn(n, dtype=dtype, device=device) if bias else None, residual, g


def formula(x, weight, bias, residual, gate):
    y = x.double() @ weight.double().T + (0.0 if bias is None else bias.double())
    return residual.double() + (y if gate is None else gate.double() * y)


def scale(dtype, k):
    """fp32: the GEMM sums k products in another order than the fp64 reference (cuBLAS, our
    kernel's tensor cores, the CPU's BLAS); 16-bit: one rounding of the output."""
    return max(10.0, k / 32) if dtype == torch.float32 else 2.0


# (B, S, K, N): one row; S below, at and past the 128-row tile (batches end inside a tile);
# K and N that are not multiples of 8 (the fallback on every GPU); several waves of tiles.
SHAPES = [(1, 1, 8, 8), (2, 7, 16, 24), (3, 129, 64, 136), (2, 128, 72, 128), (1, 300, 40, 520),
          (2, 33, 7, 5), (2, 5, 24, 13), (2, 1000, 256, 384)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("gate", ["batch", "vector", "modulation", None])
def test_matches_formula(device, dtype, shape, gate):
    b, s, k, n = shape
    args = inputs(b, s, k, n, dtype, device, gate=gate, bias=k % 2 == 0)
    got = ltx_kernels.linear_gated_residual(*args)
    assert got.dtype == dtype and got.shape == (b, s, n) and got.is_contiguous()
    ref = formula(*args)
    assert_close(got, ref, dtype, scale=scale(dtype, k))
    # No worse than what it replaces (the linear rounded to dtype, then gated_residual).
    x, weight, bias, residual, g = args
    unfused = ltx_kernels.gated_residual(residual, torch.nn.functional.linear(x, weight, bias), g)
    assert rel_err(got, ref) <= 1.1 * rel_err(unfused, ref) + 2 * TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["x_row_strided", "x_misaligned", "weight_transposed", "weight_sliced",
                                    "residual_strided", "gate_misaligned"])
def test_layouts(device, dtype, layout):
    """Views as models hand them over: each is read in place where the kernel can (16-byte
    aligned rows) and copied once where not, with the same result."""
    b, s, k, n = 2, 130, 64, 128
    x, weight, bias, residual, gate = inputs(b, s, k, n, dtype, device)
    if layout == "x_row_strided":  # a slice of a fused projection's output
        x = torch.randn(b, s, 3 * k, dtype=dtype, device=device)[..., k:2 * k]
    elif layout == "x_misaligned":
        x = torch.randn(b, s, k + 1, dtype=dtype, device=device)[..., 1:]
    elif layout == "weight_transposed":
        weight = torch.randn(k, n, dtype=dtype, device=device).t()
    elif layout == "weight_sliced":  # a group's rows of one stored weight
        weight = torch.randn(3 * n, k, dtype=dtype, device=device)[n:2 * n]
    elif layout == "residual_strided":
        residual = torch.randn(b, s, 2 * n, dtype=dtype, device=device)[..., :n]
    elif layout == "gate_misaligned":
        gate = torch.randn(b, 1, n + 1, dtype=dtype, device=device)[..., 1:]
    got = ltx_kernels.linear_gated_residual(x, weight, bias, residual, gate)
    assert_close(got, formula(x, weight, bias, residual, gate), dtype, scale=2.0)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    """No rows, and no k (the linear is its bias)."""
    for b, s, k in [(2, 0, 16), (0, 3, 16), (2, 3, 0)]:
        args = inputs(b, s, k, 16, torch.bfloat16, device)
        got = ltx_kernels.linear_gated_residual(*args)
        assert got.shape == (b, s, 16)
        assert_close(got, formula(*args), torch.bfloat16)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_writes_every_element(dtype):
    """A large output (several waves of tiles, the swizzled scheduler at 128 tiles of N) from
    fresh random data: every element checked, none left from a poisoned buffer's reuse."""
    torch.cuda.empty_cache()
    poison = torch.full((2, 1000, 16384), float("nan"), dtype=dtype, device="cuda")
    del poison  # its memory is what the output is most likely allocated from
    args = inputs(2, 1000, 256, 16384, dtype, "cuda")
    got = ltx_kernels.linear_gated_residual(*args)
    assert torch.isfinite(got).all()
    assert_close(got, formula(*args), dtype, scale=2.0)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate", ["modulation", None])
def test_cuda_cooperative_tiles(dtype, gate):
    """k >= 4096 with >= 4 waves of 128 x 256 tiles (on a 132-SM GPU): the kernel's cooperative
    configuration, batches of 4200 rows ending inside a tile (the fp64 reference on the GPU)."""
    args = inputs(2, 4200, 4096, 2048, dtype, "cuda", gate=gate)
    assert_close(ltx_kernels.linear_gated_residual(*args), formula(*args), dtype, scale=2.0)


def test_bad_inputs_name_the_argument():
    x, weight, bias, residual, gate = inputs(2, 3, 16, 8, torch.float32, "cpu")
    cases = [
        (TypeError, "weight must have x's dtype", (x, weight.half(), bias, residual, gate)),
        (ValueError, "x must be \\[B, S, K\\]", (x[0], weight, bias, residual[0], gate)),
        (ValueError, "weight must be \\[N, K\\]", (x, weight[:, :8], bias, residual, gate)),
        (ValueError, "bias must be \\[N\\]", (x, weight, bias[:4], residual, gate)),
        (ValueError, "residual must be \\[B, S, N\\]", (x, weight, bias, residual[:, :2], gate)),
        (ValueError, "gate must be \\[B, 1, N\\] or \\[N\\]", (x, weight, bias, residual, residual)),
        (TypeError, "x must be float32", (x.double(), weight, bias, residual, gate)),
    ]
    for error, message, args in cases:
        for device in ["cpu", "meta"]:
            with pytest.raises(error, match="linear_gated_residual: " + message):
                ops.linear_gated_residual(*(None if a is None else a.to(device) for a in args))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gate", ["batch", "vector", None])
def test_gradients(device, dtype, gate):
    """Every argument's gradient against autograd of the fp64 formula (the backward rounds the
    linear's gradient, gate * grad_out, to dtype before its GEMMs, as autograd of the unfused
    modules does)."""
    args = inputs(2, 37, 24, 40, dtype, device, gate=gate)
    leaves = [a.clone().requires_grad_() if a is not None else None for a in args]
    out = ltx_kernels.linear_gated_residual(*leaves)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_leaves = [a.detach().double().requires_grad_() if a is not None else None for a in args]
    formula(*ref_leaves).backward(grad.double())
    for name, got, ref in zip(["x", "weight", "bias", "residual", "gate"], leaves, ref_leaves):
        if got is None:
            continue
        assert got.grad.dtype == dtype, name
        assert_close(got.grad, ref.grad, dtype, scale=10.0 if dtype == torch.float32 else 4.0)


def test_gradcheck_fp32():
    args = [a.requires_grad_() for a in inputs(2, 3, 8, 8, torch.float32, "cpu")]
    assert torch.autograd.gradcheck(ltx_kernels.linear_gated_residual, args, eps=1e-2, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    args = inputs(2, 9, 16, 24, torch.float32, device)
    torch.library.opcheck(ops.linear_gated_residual.default, args)
    torch._dynamo.reset()
    compiled = torch.compile(ltx_kernels.linear_gated_residual, fullgraph=True)
    assert_close(compiled(*args), formula(*args), torch.float32, scale=10.0)


def test_compiled_training_step_with_dynamic_shapes():
    """Forward and backward traced by torch.compile (AOTAutograd partitions the registered
    backward op), with symbolic batch and sequence sizes: gradients as eager's."""
    torch._dynamo.reset()
    compiled = torch.compile(ltx_kernels.linear_gated_residual, fullgraph=True, dynamic=True)
    for s in (5, 9):
        args = inputs(2, s, 16, 24, torch.float32, "cpu")
        eager = [a.clone().requires_grad_() for a in args]
        traced = [a.clone().requires_grad_() for a in args]
        ltx_kernels.linear_gated_residual(*eager).square().sum().backward()
        compiled(*traced).square().sum().backward()
        for e, t in zip(eager, traced):
            assert_close(t.grad, e.grad, torch.float32, scale=10.0)

"""linear_gelu_tanh against the PyTorch formula (fp64) and torch's own bf16/fp16 result."""

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, DTYPES, ELEMENT_RTOL, TOLERANCE, activation_scale, assert_close, rel_err
from test_elementwise import TAIL, gelu_tanh_formula


def inputs(rows, k, n, dtype, device):
    x = torch.randn(rows, k, dtype=dtype, device=device)
    weight = torch.randn(n, k, dtype=dtype, device=device) / k**0.5
    bias = torch.randn(n, dtype=dtype, device=device)
    return x, weight, bias


def formula(x, weight, bias):
    return gelu_tanh_formula(x.double() @ weight.double().T + bias.double())


def fp32_tanh_form(h):
    """GELU as cuBLASLt's epilogue (our 16-bit CUDA path) and torch's CUDA GELU evaluate it:
    0.5 h (1 + tanh u) in fp32, whose 1 + tanh cancels below h ~ -3 (0 below h ~ -5)."""
    h = h.float()
    return (0.5 * h * (1 + torch.tanh(0.7978845608028654 * (h + 0.044715 * h**3)))).double()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,n", [(1, 7, 5), (3, 64, 256), (67, 111, 769), (128, 256, 1024)])
def test_matches_formula(device, dtype, rows, k, n):
    x, weight, bias = inputs(rows, k, n, dtype, device)
    got = ltx_kernels.linear_gelu_tanh(x, weight, bias)
    assert got.dtype == dtype and got.shape == (rows, n)
    # fp32: cuBLAS sums in another order than the fp64 reference. 16-bit: where cuBLASLt
    # cannot take the shape (e.g. one row), the result is rounded before the GELU as well.
    assert_close(got, formula(x, weight, bias), dtype, scale=10 if dtype == torch.float32 else 2)
    # No worse than the unfused torch expression in the same dtype, but for the rounding of
    # single elements (a one-row output of 5 elements: one output step up or down moves the
    # relative error by ~2^-11 in fp16; 1 in 4000 draws failed a 10% margin).
    stock = torch.nn.functional.gelu(torch.nn.functional.linear(x, weight, bias), approximate="tanh")
    ref = formula(x, weight, bias)
    assert rel_err(got, ref) <= 1.1 * rel_err(stock, ref) + max(ELEMENT_RTOL[dtype], TOLERANCE[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_negative_tail(device, dtype):
    """Pre-activations far below 0 (x @ 1 + 0: exact in every dtype), each alone (a one-element
    output: its own value sets the tolerance) and all together: the GELU's value, not 0,
    wherever that value is a normal number of dtype (as the gelu_tanh op), but for the 16-bit
    CUDA path, the GEMM epilogue's fp32 tanh form."""
    z = torch.tensor(TAIL, dtype=dtype, device=device)[:, None]
    weight = torch.ones(1, 1, dtype=dtype, device=device)
    bias = torch.zeros(1, dtype=dtype, device=device)
    # 16 bits on CUDA: the fp32 tanh form (documented in src/torch/linear.cpp), 0 in the tail.
    reference = fp32_tanh_form if device == "cuda" and dtype != torch.float32 else gelu_tanh_formula
    for x in [z, *z[:, None]]:
        assert_close(ltx_kernels.linear_gelu_tanh(x, weight, bias), reference(x.double() @ weight.double().T),
                     dtype, scale=activation_scale(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_leading_dims_and_strided_rows(device):
    x, weight, bias = inputs(24, 64, 96, torch.bfloat16, device)
    x3 = torch.randn(2, 12, 80, dtype=torch.bfloat16, device=device)[..., 8:72]  # row-strided view
    got = ltx_kernels.linear_gelu_tanh(x3, weight, bias)
    assert got.shape == (2, 12, 96)
    assert_close(got, formula(x3, weight, bias), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pre_activation_rounded_once_in_every_layout(device, dtype):
    """x @ w^T + b where the bias cancels most of the product (h = 2.13 - 1.90 = 0.23): a
    row-strided x gives the contiguous x's output bit for bit. torch's CPU linear rounds a
    strided 16-bit x's product before adding the bias (h 0.2266 instead of 0.2334, the output
    3% off); a held-out fuzz run found it (FUZZ_SEED=99)."""
    values = torch.tensor([-1.1094, -1.0312, 1.6016, -1.4141], dtype=dtype, device=device)
    weight = torch.tensor([[-1.5078]], dtype=dtype, device=device)
    bias = torch.tensor([-1.8984], dtype=dtype, device=device)
    wide = torch.zeros(1, 4, 6, dtype=dtype, device=device)
    wide[..., 2] = values
    strided = wide[..., 2:3]
    got = ltx_kernels.linear_gelu_tanh(strided, weight, bias)
    assert torch.equal(got, ltx_kernels.linear_gelu_tanh(strided.contiguous(), weight, bias))
    if device == "cpu":  # (CUDA's 16-bit GELU reads h in fp32: test_matches_formula)
        assert_close(got, formula(strided, weight, bias), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    x, weight, bias = inputs(16, 32, 48, torch.float32, device)
    torch.library.opcheck(torch.ops.ltx_kernels.linear_gelu_tanh, (x, weight, bias))
    compiled = torch.compile(ltx_kernels.linear_gelu_tanh, fullgraph=True, dynamic=True,
                             backend="inductor" if device == "cuda" else "aot_eager")
    torch.testing.assert_close(compiled(x, weight, bias), ltx_kernels.linear_gelu_tanh(x, weight, bias))


def test_bad_inputs_name_the_argument():
    x, weight, bias = inputs(4, 8, 16, torch.float32, "cpu")
    with pytest.raises(TypeError, match="weight and bias must have x's dtype"):
        ltx_kernels.linear_gelu_tanh(x, weight.double(), bias)
    with pytest.raises(ValueError, match="weight must be \\[N, K\\]"):
        ltx_kernels.linear_gelu_tanh(x, weight[:, :4], bias)
    with pytest.raises(ValueError, match="bias must be \\[N\\]"):
        ltx_kernels.linear_gelu_tanh(x, weight, bias[:3])
    with pytest.raises(TypeError, match="x must be float32"):
        ltx_kernels.linear_gelu_tanh(x.long(), weight, bias)

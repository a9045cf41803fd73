"""linear_gelu_tanh against the PyTorch formula (fp64) and torch's own bf16/fp16 result."""

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, DTYPES, ELEMENT_RTOL, TOLERANCE, assert_close, rel_err


def inputs(rows, k, n, dtype, device):
    x = torch.randn(rows, k, dtype=dtype, device=device)
    weight = torch.randn(n, k, dtype=dtype, device=device) / k**0.5
    bias = torch.randn(n, dtype=dtype, device=device)
    return x, weight, bias


def formula(x, weight, bias):
    return torch.nn.functional.gelu(x.double() @ weight.double().T + bias.double(), approximate="tanh")


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
def test_leading_dims_and_strided_rows(device):
    x, weight, bias = inputs(24, 64, 96, torch.bfloat16, device)
    x3 = torch.randn(2, 12, 80, dtype=torch.bfloat16, device=device)[..., 8:72]  # row-strided view
    got = ltx_kernels.linear_gelu_tanh(x3, weight, bias)
    assert got.shape == (2, 12, 96)
    assert_close(got, formula(x3, weight, bias), torch.bfloat16)


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

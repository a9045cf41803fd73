"""glu_linear: (act(a) * b) @ weight.T + bias, against the two ops it stands for (bit for bit:
it runs them) and the fp64 formula; its checks. Gradients: test_backward.py; in a patched
Llama: test_transformers_integration.py."""

import math

import pytest
import torch
import torch.nn.functional as F

import ltx_kernels
from conftest import DEVICES, DTYPES, activation_scale, assert_close
from test_elementwise import gelu_formula, gelu_tanh_formula, silu_formula

ops = torch.ops.ltx_kernels
ACTIVATIONS = {"silu": (ltx_kernels.silu_and_mul, silu_formula),
               "gelu_tanh": (ltx_kernels.gelu_tanh_and_mul, gelu_tanh_formula),
               "gelu": (ltx_kernels.gelu_and_mul, gelu_formula)}


def inputs(shape, n, dtype, device, strided=False, bias=True):
    """a and b of `shape` (strided: the two halves of one [..., 2K] tensor, as a fused gate/up
    projection gives them), weight [n, K], bias [n] or None."""
    k = shape[-1]
    if strided:
        a, b = (torch.randn(*shape[:-1], 2 * k, device=device) * 3).to(dtype).chunk(2, dim=-1)
    else:
        a, b = (torch.randn(shape, device=device) * 3).to(dtype), torch.randn(shape, device=device).to(dtype)
    weight = (torch.randn(n, k, device=device) / math.sqrt(max(k, 1))).to(dtype)
    return a, b, weight, torch.randn(n, device=device).to(dtype) if bias else None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("shape, n", [((1, 7), 5), ((2, 3, 64), 96), ((67, 130), 17), ((0, 16), 8)])
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_is_the_activation_then_the_linear(device, dtype, activation, shape, n, strided, bias):
    a, b, weight, bias_t = inputs(shape, n, dtype, device, strided, bias)
    and_mul, formula = ACTIVATIONS[activation]
    got = ltx_kernels.glu_linear(a, b, weight, bias_t, activation)
    assert got.dtype == dtype and got.shape == (*shape[:-1], n)
    assert torch.equal(got, F.linear(and_mul(a, b), weight, bias_t))
    h = (formula(a) * b.double()).to(dtype).double()  # the activation as the forward rounds it
    ref = h @ weight.double().T + (0 if bias_t is None else bias_t.double())
    assert_close(got, ref, dtype, scale=2 * activation_scale(dtype) * (5 if dtype == torch.float32 else 1))


def test_default_activation_is_silu():
    a, b, weight, _ = inputs((4, 16), 8, torch.float32, "cpu")
    assert torch.equal(ltx_kernels.glu_linear(a, b, weight), ltx_kernels.glu_linear(a, b, weight, None, "silu"))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    a, b, weight, bias = inputs((3, 5, 16), 8, torch.float32, device, strided=True)
    for args in [(a, b, weight, bias, "silu"), (a, b, weight, None, "gelu")]:
        torch.library.opcheck(ops.glu_linear.default, args)


def bad_calls():
    a, b, weight, bias = inputs((3, 16), 8, torch.float32, "cpu")
    return [
        ((a, b, weight, bias, "relu"), ValueError, "activation"),
        ((a.int(), b, weight, bias, "silu"), TypeError, "a must be"),
        ((a, b[:, :15], weight, bias, "silu"), ValueError, "b must have the shape of a"),
        ((a, b.double(), weight, bias, "silu"), TypeError, "b must have the dtype of a"),
        ((a, b, weight[:, :15], bias, "silu"), ValueError, "weight must be"),
        ((a, b, weight[0], bias, "silu"), ValueError, "weight must be"),
        ((a, b, weight.half(), bias, "silu"), TypeError, "weight must have the dtype of a"),
        ((a, b, weight.to("meta"), bias, "silu"), ValueError, "weight must be on the device of a"),
        ((a, b, weight, bias[:7], "silu"), ValueError, "bias must be"),
        ((a, b, weight, bias.half(), "silu"), TypeError, "bias must have the dtype of a"),
    ]


@pytest.mark.parametrize("case", range(len(bad_calls())))
def test_bad_input_names_the_op_and_the_argument(case):
    args, error, match = bad_calls()[case]
    with pytest.raises(error, match="glu_linear") as raised:
        ltx_kernels.glu_linear(*args)
    assert match in str(raised.value)


def test_backward_checks_grad_out():
    a, b, weight, bias = inputs((3, 16), 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match="glu_linear_backward: grad_out must be"):
        ops.glu_linear_backward(torch.randn(3, 7), a, b, weight, bias, "silu")
    with pytest.raises(TypeError, match="glu_linear_backward: grad_out must have the dtype of a"):
        ops.glu_linear_backward(torch.randn(3, 8).double(), a, b, weight, bias, "silu")

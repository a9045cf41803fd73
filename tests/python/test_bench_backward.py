"""The forward + backward benchmark (bench/backward.py) on the CPU: it covers the ops with a
backward, each eager anchor computes what our op does (outputs and gradients, the check the
benchmark runs before timing), a timed step returns every input's gradient, a missing
Liger-Kernel drops its column, and without CUDA main() says what to run instead."""

import sys

import pytest
import torch

from ltx_kernels.bench import backward

TINY = [("tiny 3x16", 3, 16)]


def test_covers_the_ops_with_a_backward():
    assert set(backward.OPS) == {"rms_norm", "fused_add_rms_norm", "layer_norm", "silu_and_mul",
                                 "gelu_tanh_and_mul", "swiglu", "geglu", "gelu_tanh"}
    assert set(backward.LIGER) <= set(backward.OPS)


@pytest.mark.parametrize("op", sorted(backward.OPS))
def test_eager_anchor_computes_what_ours_does(op):
    torch.manual_seed(0)
    (case,) = backward.cases(TINY, [op], torch.float32, device="cpu")
    assert case.check() < 1e-5  # fp32: rounding only


@pytest.mark.parametrize("op", sorted(backward.OPS))
def test_step_returns_every_gradient(op):
    torch.manual_seed(0)
    (case,) = backward.cases(TINY, [op], torch.float32, device="cpu")
    grads, expected = case.impls["ltx_kernels"](), case.impls["eager"]()
    shapes = backward.OPS[op].shapes(3, 16)
    assert [tuple(g.shape) for g in grads] == shapes
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_without_liger_there_is_no_liger_column(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel.ops", None)  # import fails as if not installed
    assert backward._liger() == {}
    (case,) = backward.cases(TINY, ["rms_norm"], torch.float32, backward._liger(), device="cpu")
    assert list(case.impls) == ["ltx_kernels", "eager", "compile"]


def test_without_cuda_it_says_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backward.main(["--ops", "rms_norm", "swiglu", "--dtype", "fp16"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err

"""The LLM head loss benchmark (bench/cross_entropy.py): without CUDA it says so; its step gives
ours the loss and gradients of the eager formula on the CPU (small shapes); the report puts a
failed mode in its row and ours' speed-up beside every other mode."""

import torch

from ltx_kernels.bench import cross_entropy, harness


def test_main_without_cuda_says_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cross_entropy.main([]) == harness.no_cuda("the LLM head loss benchmark")
    assert capsys.readouterr().err.count("needs a CUDA device") == 2


def test_step_of_ours_is_the_eager_formula_on_cpu():
    x, weight, target = cross_entropy.inputs(37, 24, 300, device="cpu")
    x, weight = x.float(), weight.float()
    ours = cross_entropy.step(cross_entropy.loss_fns()["ours"], x, weight, target)
    stock = cross_entropy.step(cross_entropy.eager, x, weight, target)
    for a, b in zip(ours, stock):
        assert harness.rel_err(a, b) < 1e-5


def test_report_rows_and_speedups():
    rows = [dict(shape="s", tokens=2, hidden=3, vocab=5, mode="eager", ms=6.0, peak_gib=1.0, loss_err=1e-6,
                 grad_x_err=1e-3, grad_w_err=2e-3),
            dict(shape="s", tokens=2, hidden=3, vocab=5, mode="liger", error="RuntimeError: no"),
            dict(shape="s", tokens=2, hidden=3, vocab=5, mode="ours", ms=4.0, peak_gib=0.5, loss_err=1e-6,
                 grad_x_err=1e-3, grad_w_err=2e-3)]
    text = cross_entropy.markdown(rows, {"gpu": "GPU", "torch": "2"})
    assert "| s (2 x 3 -> 5) | liger | failed: RuntimeError: no |" in text
    assert "| s (2 x 3 -> 5) | ours | 4.00 | 0.50 | 1.0e-06 | 1.0e-03 / 2.0e-03 |" in text
    assert cross_entropy.speedups(rows) == ["s: ours vs eager 1.50x"]

"""The LoRA training benchmark (python -m ltx_kernels.bench.ltx_train) on the CPU: its training
step on the tiny LTX config in fp32, stock and ours, and its report of failed modes. The timing
itself needs CUDA."""

import argparse

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")
from ltx_kernels._patching import is_patched  # noqa: E402
from ltx_kernels.bench import ltx_train  # noqa: E402

RANK = 4


def test_needs_cuda(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ltx_train.main([]) == 2
    assert "the LoRA training benchmark needs a CUDA device" in capsys.readouterr().err


def test_training_step_trains_the_adapters_alone_like_stock():
    """Eager and ours from the same weights: the same first-step loss, and the step changes
    every LoRA parameter (one A and one B per targeted linear) and nothing else."""
    losses = {}
    for mode in ("eager", "ours"):
        model, step = ltx_train.lora_training(mode, "tiny", torch.float32, "cpu", 9, 64, 96, RANK)
        assert is_patched(model.transformer_blocks[0]) == (mode == "ours")
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        losses[mode] = step().item()
        changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
        lora = {name for name in before if ".lora_" in name}
        # 2 blocks x (4 projections in each of 2 attentions + 2 feed-forward linears) x (A, B)
        assert len(lora) == 2 * (4 * 2 + 2) * 2
        assert changed == lora, mode
        assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)
    assert abs(losses["ours"] - losses["eager"]) <= 1e-4 * abs(losses["eager"])


def test_a_failing_mode_is_reported_and_the_others_compared(monkeypatch):
    """run() without the GPU: measure stubbed, its compile mode raising."""

    def measure(mode, args, row):
        if mode == "compile":
            raise RuntimeError("no graph")
        row.update(first_loss={"eager": 2.0, "ours": 2.002}.get(mode, 2.0), first_step_s=1.0, peak_mem_gib=1.0,
                   step_ms={"eager": 30.0, "ours": 20.0, "ours+compile": 15.0}[mode])

    monkeypatch.setattr(ltx_train, "measure", measure)
    args = argparse.Namespace(modes=ltx_train.MODES, config="2b", frames=49, height=512, width=768, rank=64, reps=5,
                              checkpointing=False)
    rows = {r["mode"]: r for r in ltx_train.run(args)}
    assert rows["compile"] == {"mode": "compile", "error": "RuntimeError: no graph"}
    assert rows["ours"]["loss_vs_eager"] == pytest.approx(1e-3)
    text = ltx_train.markdown(list(rows.values()), {"gpu": "GPU", "torch": torch.__version__}, args)
    assert "| compile | failed: RuntimeError: no graph |" in text
    assert "ours vs eager 1.50x (target >= 1.50x: met)" in text and "ours+compile vs" not in text

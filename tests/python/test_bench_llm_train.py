"""The LLM training-step benchmark (bench/llm_train.py): without CUDA it says so and what to run
instead; its training step runs on a tiny Llama (the benchmark's structure at small widths) in
fp32 on the CPU, stock and with ltx_kernels applied, from the same weights and batch."""

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from ltx_kernels.bench import harness, llm_e2e, llm_train  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=101)


def tiny_llama():
    """As llm_e2e.random_model builds its model (seed 0, sdpa), at small widths, fp32 on the CPU."""
    config = AutoConfig.for_model("llama", num_hidden_layers=2, **{**llm_e2e.LLAMA3_8B, **TINY})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def test_main_without_cuda_says_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert llm_train.main([]) == harness.no_cuda("the LLM training-step benchmark")
    err = capsys.readouterr().err
    assert err.count("needs a CUDA device") == 2


def test_train_step_on_cpu_matches_stock_and_updates_weights():
    batch = llm_train.random_batch(TINY["vocab_size"], 2, 9, device="cpu")
    losses = {}
    for mode in ("eager", "ours"):
        model = tiny_llama()
        before = model.model.layers[0].mlp.down_proj.weight.detach().clone()
        forward, optimizer = llm_train.setup(mode, model)
        losses[mode] = llm_train.train_step(forward, optimizer, batch).item()
        assert not torch.equal(model.model.layers[0].mlp.down_proj.weight, before), mode
        assert all(p.grad is None for p in model.parameters()), mode  # zero_grad(set_to_none=True)
    assert abs(losses["ours"] - losses["eager"]) < 1e-4, losses

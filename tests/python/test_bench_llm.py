"""The LLM benchmark's models (bench/llm_e2e.py): each --model builds at full width, and a tiny
one of the same structure runs the benchmark's two phases (prefill into a StaticCache, one
decode token against it) with ltx_kernels applied as stock does (CPU)."""

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM, StaticCache  # noqa: E402

import ltx_kernels.transformers as lt  # noqa: E402
from ltx_kernels.bench import llm_e2e  # noqa: E402

SHAPES = {"llama3-8b": ("LlamaForCausalLM", 4096, 32), "falcon-7b": ("FalconForCausalLM", 4544, 71)}
# The tiny models: each --model's structure (heads sharing kv, rotary, parallel attention and
# MLP) at small widths.
TINY = {
    "llama3-8b": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      vocab_size=101),
    "falcon-7b": dict(hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, vocab_size=101),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(llm_e2e.MODELS))
def test_models_build_at_full_width(name):
    model = llm_e2e.random_model(name, 1, torch.bfloat16, "meta")
    cls, hidden, heads = SHAPES[name]
    assert type(model).__name__ == cls
    assert (model.config.hidden_size, model.config.num_attention_heads) == (hidden, heads)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("name", sorted(llm_e2e.MODELS))
@torch.no_grad()
def test_tiny_model_runs_both_phases_like_stock(name):
    model_type, dims, _ = llm_e2e.MODELS[name]
    config = AutoConfig.for_model(model_type, num_hidden_layers=2, **{**dims, **TINY[name]})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    prompt = torch.randint(0, config.vocab_size, (1, 9))
    token = torch.randint(0, config.vocab_size, (1, 1))

    def phases():
        cache = StaticCache(config=config, max_cache_len=16)
        prefill = model(input_ids=prompt, past_key_values=cache, logits_to_keep=1).logits
        return prefill, model(input_ids=token, past_key_values=cache, logits_to_keep=1).logits

    stock = phases()
    report = lt.apply(model)
    assert report.patched
    for ours, expected in zip(phases(), stock):
        torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)

"""ltx_kernels.transformers.apply on tiny random Llama, Mistral, Qwen2, Qwen3 and Gemma models.

The bar is stock: patched bf16 logits must be no further from stock fp32 than stock bf16's
are (x1.1), and greedy generation in fp32 must pick the same tokens as stock.
"""

import warnings

import pytest
import torch
from conftest import DEVICES, HAS_CUDA

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, StaticCache  # noqa: E402

import ltx_kernels.transformers as lt  # noqa: E402
from ltx_kernels import _forwards  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from ltx_kernels.integrations.transformers import causal, falcon  # noqa: E402

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"]
# Families whose decoder layers run fused_add_rms_norm (Gemma 2 and 3 norm before each residual
# add, Phi-3 applies a residual dropout: their layers stay stock, their norms each patched).
FUSED_DECODER = ["llama", "mistral", "qwen2", "qwen3", "gemma"]

# Odd-ish sizes, GQA (6 query heads on 2 kv heads) and, for Qwen3 and Gemma, a head_dim that
# is not hidden / heads. Llama carries Llama-3 rope scaling, Mistral a sliding window shorter
# than the prompt.
SIZES = dict(
    vocab_size=211, hidden_size=96, intermediate_size=136, num_hidden_layers=2,
    num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
)  # fmt: skip
EXTRA = {
    "llama": dict(
        rope_parameters=dict(
            rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=16,
        )  # fmt: skip
    ),
    "mistral": dict(sliding_window=6),
    "qwen3": dict(head_dim=24),
    "gemma": dict(head_dim=24),
    # local (sliding) and global layers, a window shorter than the prompt; Gemma 2 caps its
    # attention logits (softcap 50 by default). Its final-logit cap keeps the loss stock, which
    # apply reports (test_transformers_loss.py): off here, so that apply patches all silently.
    "gemma2": dict(head_dim=24, sliding_window=6, query_pre_attn_scalar=20, final_logit_softcapping=None),
    "gemma3_text": dict(head_dim=24, sliding_window=6, query_pre_attn_scalar=20),
    # fused q/k/v and gate/up projections; RoPE on half of each head (partial rotary)
    "phi3": dict(partial_rotary_factor=0.5, sliding_window=6, pad_token_id=0),
}


def tiny_model(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **{**SIZES, **EXTRA.get(model_type, {}), **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # the default init (std 0.02, unit norms) leaves logits near zero
        for name, p in model.named_parameters():
            p.normal_(0.0, 1.0 if "norm" in name else 0.1)
    return model


def prompt(batch: int = 2, length: int = 14, pad: int = 4, device="cpu", seed: int = 1):
    """Random ids with the second row left-padded by ``pad`` tokens."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, SIZES["vocab_size"], (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, :pad] = 0
    ids[1, :pad] = 0
    return ids.to(device), mask.to(device)


def logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits.float()


def rel(out, ref, mask):
    keep = mask.bool()
    return ((out[keep] - ref[keep]).norm() / ref[keep].norm()).item()


def apply_quietly(model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a supported family patches everything, silently
        return lt.apply(model)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_bf16_logits_no_worse_than_stock(model_type, device):
    """Patched bf16 vs fp32 stock, no worse than stock bf16 (x1.1), summed over 3 random models:
    on one tiny model the ratio scatters by +-15% with the CPU's GEMM rounding order."""
    stock_err = patched_err = 0.0
    for seed in range(3):
        model = tiny_model(model_type, seed=seed).to(device)
        ids, mask = prompt(device=device, seed=seed + 1)
        reference = logits(model, ids, mask)
        model = model.to(torch.bfloat16)
        stock = logits(model, ids, mask)
        report = apply_quietly(model)
        patched = logits(model, ids, mask)
        layers = SIZES["num_hidden_layers"]
        assert report.skipped == []
        assert report.patched["attention rotary embedding (apply_rotary_pos_emb)"] == layers
        assert report.patched[causal.MODEL_KIND] == 1
        fused = report.patched["decoder layer residual + post-attention norm (fused_add_rms_norm)"]
        assert fused == (layers if model_type in FUSED_DECODER else 0)
        assert sum(v for k, v in report.patched.items() if k.startswith("gated MLP")) == layers
        norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
        assert report.patched["RMSNorm (rms_norm)"] == len(norms) >= 2 * layers + 1
        assert torch.isfinite(patched).all()
        stock_err += rel(stock, reference, mask)
        patched_err += rel(patched, reference, mask)
    assert 0 < stock_err
    assert patched_err <= 1.1 * stock_err, (patched_err, stock_err)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_fp32_greedy_generate_identical(model_type):
    model = tiny_model(model_type)
    ids, mask = prompt()
    kwargs = dict(attention_mask=mask, max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        stock = model.generate(ids, **kwargs)
        apply_quietly(model)
        patched = model.generate(ids, **kwargs)
    assert patched.shape == (2, ids.shape[1] + 20)
    assert torch.equal(patched, stock)


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"])
def test_kv_cache_decode_matches_full_forward(model_type, device, cache_kind):
    """Prefill then one-token decode steps through the cache give the full forward's logits."""
    model = tiny_model(model_type).to(device)
    lt.apply(model)
    ids, mask = prompt(length=17, device=device)
    full = logits(model, ids, mask)
    if cache_kind == "dynamic":
        cache = DynamicCache(config=model.config)
    else:
        cache = StaticCache(config=model.config, max_cache_len=ids.shape[1])
    prefill = 12
    with torch.no_grad():
        steps = [model(input_ids=ids[:, :prefill], attention_mask=mask[:, :prefill], past_key_values=cache).logits]
        for t in range(prefill, ids.shape[1]):
            out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache)
            steps.append(out.logits)
    cached = torch.cat(steps, dim=1).float()
    assert rel(cached, full, mask) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"])
def test_compile_fullgraph(model_type, device):
    model = tiny_model(model_type).to(device)
    lt.apply(model)
    ids, mask = prompt(device=device)
    eager = logits(model, ids, mask)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    assert rel(logits(compiled, ids, mask), eager, mask) < 1e-5


def test_remove_restores_stock_exactly_and_apply_is_idempotent():
    model = tiny_model("llama")
    ids, mask = prompt()
    stock = logits(model, ids, mask)
    first = lt.apply(model)
    with pytest.warns(UserWarning, match="already patched"):
        second = lt.apply(model)
    assert sum(second.patched.values()) == 0
    assert lt.remove(model) == sum(first.patched.values())
    assert not any("_ltx_kernels_patch" in m.__dict__ or "_ltx_eps" in m.__dict__ for m in model.modules())
    assert torch.equal(logits(model, ids, mask), stock)
    with lt.applied(model) as report:
        assert sum(report.patched.values()) == sum(first.patched.values())
    assert torch.equal(logits(model, ids, mask), stock)


def test_gemma2_attention_keeps_its_logit_softcap():
    """A strong cap (0.5) changes the logits far beyond 1e-5; patched, they stay stock's. (Eager
    attention: transformers' sdpa path ignores the cap.)"""
    model = tiny_model("gemma2", attn_logit_softcapping=0.5)
    uncapped = tiny_model("gemma2", attn_logit_softcapping=None)
    for m in (model, uncapped):
        m.set_attn_implementation("eager")
    ids, mask = prompt()
    stock = logits(model, ids, mask)
    assert rel(logits(uncapped, ids, mask), stock, mask) > 1e-3
    apply_quietly(model)
    assert rel(logits(model, ids, mask), stock, mask) < 1e-5


@pytest.mark.parametrize("model_type, offset", [("granite", 0.0), ("vaultgemma", 1.0)])
def test_unknown_architecture_patches_only_checked_norms(model_type, offset):
    """Granite (plain RMSNorm) and VaultGemma (1 + weight) are not dispatched on: their norms
    are patched after a check against their own forward, nothing else is."""
    model = tiny_model(model_type)
    ids, mask = prompt()
    stock = logits(model, ids, mask)
    with pytest.warns(UserWarning, match=f"model_type '{model_type}' is not one of"):
        report = lt.apply(model)
    assert set(report.patched) == {"RMSNorm (rms_norm)"}
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert report.patched["RMSNorm (rms_norm)"] == len(norms) > 0
    forward = {0.0: _forwards.rms_norm_forward, 1.0: _forwards.gemma_rms_norm_forward}[offset]
    assert all(m.forward.__func__ is forward for m in norms)
    assert rel(logits(model, ids, mask), stock, mask) < 1e-5


def test_unknown_norm_formula_is_left_alone():
    class OddRMSNorm(torch.nn.Module):  # x / rms, times weight, plus one: not an RMSNorm we compute
        def __init__(self, dim):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(dim))
            self.eps = 1e-6

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight + 1

    model = tiny_model("granite")
    model.model.norm = OddRMSNorm(SIZES["hidden_size"])
    with pytest.warns(UserWarning, match="model.norm \\(OddRMSNorm\\): its forward is neither"):
        report = lt.apply(model)
    assert "_ltx_kernels_patch" not in model.model.norm.__dict__
    assert report.patched["RMSNorm (rms_norm)"] == 2 * SIZES["num_hidden_layers"]


def tiny_gpt2():
    """A model apply has nothing for: GPT-2 (LayerNorm, GELU MLP, not a family of ours)."""
    config = AutoConfig.for_model("gpt2", vocab_size=211, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def test_model_with_nothing_to_patch_names_its_class_and_the_supported_ones():
    model = tiny_gpt2()
    with pytest.raises(ValueError, match="apply: nothing to patch in GPT2LMHeadModel \\(model_type 'gpt2'\\): "
                                         "ltx_kernels supports the model types gemma, gemma2, gemma3_text, llama, mistral, phi3, qwen2, qwen3"):
        lt.apply(model)
    assert not any(is_patched(m) for m in model.modules())


def test_strict_false_warns_and_returns_an_empty_report():
    model = tiny_gpt2()
    ids = torch.randint(0, 211, (2, 9))
    stock = model(ids).logits
    with pytest.warns(UserWarning, match="nothing to patch in GPT2LMHeadModel.*strict=False: nothing patched"):
        report = lt.apply(model, strict=False)
    assert not report.patched and not report.skipped and not report.notes
    assert torch.equal(model(ids).logits, stock)
    with pytest.raises(TypeError, match="apply: strict must be a bool, got int"):
        lt.apply(model, strict=0)


def tiny_falcon(seed=0, **config):
    """fp32 tiny Falcon; LayerNorm weights and biases randomized so that they matter."""
    config = AutoConfig.for_model("falcon", vocab_size=211, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, **config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_(1.0, 0.5)
                m.bias.normal_(0.0, 0.5)
    return model


FALCON_VARIANTS = {
    "7b": dict(new_decoder_architecture=False, parallel_attn=True),  # one LayerNorm, multi-query
    "40b": dict(new_decoder_architecture=True, num_kv_heads=2),  # ln_attn and ln_mlp
    "mha": dict(new_decoder_architecture=False, multi_query=False, parallel_attn=False),
    "rw-alibi": dict(new_decoder_architecture=False, parallel_attn=False, alibi=True),
}
ROTARY_FALCONS = ["7b", "40b", "mha"]


def falcon_report(model, variant):
    if variant in ROTARY_FALCONS:
        return apply_quietly(model)
    with pytest.warns(UserWarning, match="ALiBi attention .* stays stock"):
        return lt.apply(model)


def sdpa_spy(monkeypatch):
    """Records the keyword arguments of every SDPA call (stock's and ours)."""
    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def masked_calls(calls):
    return sum(c.get("attn_mask") is not None for c in calls)


@pytest.mark.parametrize("variant", FALCON_VARIANTS)
def test_falcon_layer_norms(variant):
    """Falcon: every LayerNorm runs layer_norm (the count checked), rotary models' attention and
    model forwards are patched (ALiBi's reported), logits match stock in fp32 with padding, and
    remove() restores the stock forwards."""
    model = tiny_falcon(**FALCON_VARIANTS[variant])
    ids, mask = prompt()
    stock = logits(model, ids, mask)
    report = falcon_report(model, variant)
    norms = [m for m in model.modules() if type(m) is torch.nn.LayerNorm]
    expected = {"LayerNorm (layer_norm)": len(norms)}
    if variant in ROTARY_FALCONS:
        expected.update({falcon.MODEL_KIND: 1, falcon.ATTENTION_KIND: 2})
    assert dict(report.patched) == expected and len(norms) >= 3
    assert report.notes[0].startswith("model_type 'falcon': its LayerNorms run layer_norm")
    assert all(m.forward.__func__ is _forwards.layer_norm_forward for m in norms)
    assert rel(logits(model, ids, mask), stock, mask) < 1e-5
    assert lt.remove(model) == sum(expected.values())
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert torch.equal(logits(model, ids, mask), stock)


@pytest.mark.parametrize("variant", ROTARY_FALCONS)
def test_falcon_causal_prefill_skips_the_mask(variant, monkeypatch):
    """A call whose mask is the plain causal one (none, all ones, positions 0..S-1) runs SDPA
    causal without a mask (FlashAttention on the GPU) and matches stock; padding, packed
    positions and a non-empty cache keep stock's masked SDPA."""
    model = tiny_falcon(**FALCON_VARIANTS[variant])
    ids, mask = prompt()
    ones = torch.ones_like(mask)
    with torch.no_grad():
        stock = {name: model(input_ids=ids, **kw).logits for name, kw in (
            ("none", {}), ("ones", dict(attention_mask=ones)), ("padded", dict(attention_mask=mask)),
            ("positions", dict(position_ids=torch.arange(ids.shape[1]).expand(2, -1))))}
        packed = torch.cat([torch.arange(5), torch.arange(ids.shape[1] - 5)]).expand(2, -1)
        stock["packed"] = model(input_ids=ids, position_ids=packed).logits
        apply_quietly(model)
        calls = sdpa_spy(monkeypatch)
        for name, kw, mask_free in (("none", {}, True), ("ones", dict(attention_mask=ones), True),
                                    ("positions", dict(position_ids=torch.arange(ids.shape[1]).expand(2, -1)), True),
                                    ("padded", dict(attention_mask=mask), False),
                                    ("packed", dict(position_ids=packed), False)):
            calls.clear()
            out = model(input_ids=ids, **kw).logits
            keep = mask if name == "padded" else ones
            assert rel(out, stock[name], keep) < 1e-5, name
            assert len(calls) == 2 and masked_calls(calls) == (0 if mask_free else 2), name
            if mask_free:
                assert all(c["is_causal"] for c in calls)
        # prefill into a cache, then decode: the prefill runs mask-free, each decode step stock's
        calls.clear()
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True)
        assert masked_calls(calls) == 0
        last = model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True).logits
        assert masked_calls(calls) == 2
        assert rel(last, stock["none"][:, -1:], ones[:, -1:]) < 1e-5


@pytest.mark.parametrize("variant", ["7b", "40b"])
def test_falcon_fp32_greedy_generate_identical(variant):
    model = tiny_falcon(**FALCON_VARIANTS[variant])
    ids, mask = prompt()
    for attention_mask in (mask, torch.ones_like(mask)):
        kwargs = dict(attention_mask=attention_mask, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                      pad_token_id=0)
        with torch.no_grad():
            stock = model.generate(ids, **kwargs)
            apply_quietly(model)
            patched = model.generate(ids, **kwargs)
            lt.remove(model)
        assert torch.equal(patched, stock)


@pytest.mark.parametrize("checkpointing", [None, "reentrant", "non-reentrant"])
def test_falcon_mask_free_gradients_match_stock(checkpointing):
    """Training on unpadded batches takes the mask-free path, under gradient checkpointing too
    (the recomputation sees the same attention_mask=None): every gradient as stock's."""
    ids, _ = prompt()
    grads = []
    for patched in (False, True):
        model = tiny_falcon(**FALCON_VARIANTS["7b"]).train()
        if checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs=dict(use_reentrant=checkpointing == "reentrant"))
        if patched:
            apply_quietly(model)
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    stock, ours = grads
    assert stock.keys() == ours.keys()
    for name in stock:
        assert ours[name] is not None, name
        assert (ours[name] - stock[name]).norm() <= 1e-4 * stock[name].norm() + 1e-7, name


def test_falcon_bf16_no_worse_than_stock_and_trains():
    reference = tiny_falcon(**FALCON_VARIANTS["40b"])
    ids, mask = prompt()
    exact = logits(reference, ids, mask)
    stock16 = tiny_falcon(**FALCON_VARIANTS["40b"]).to(torch.bfloat16)
    ours16 = tiny_falcon(**FALCON_VARIANTS["40b"]).to(torch.bfloat16)
    apply_quietly(ours16)
    err_stock, err_ours = rel(logits(stock16, ids, mask), exact, mask), rel(logits(ours16, ids, mask), exact, mask)
    assert err_ours <= 1.1 * err_stock + 1e-3, (err_ours, err_stock)
    # gradients flow through the patched norms (layer_norm has a backward)
    train = tiny_falcon(**FALCON_VARIANTS["7b"]).train()
    apply_quietly(train)
    train(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0
               for m in train.modules() if type(m) is torch.nn.LayerNorm)


def test_unsupported_activation_is_reported():
    model = tiny_model("llama", hidden_act="relu")
    with pytest.warns(UserWarning, match="no fused gated op for hidden_act='relu'"):
        report = lt.apply(model)
    assert not any(k.startswith("gated MLP") for k in report.patched)
    assert report.patched["RMSNorm (rms_norm)"] > 0


def test_unsupported_dtype_patches_nothing():
    model = tiny_model("llama").double()
    with pytest.warns(UserWarning, match="torch.float64"):
        report = lt.apply(model)
    assert sum(report.patched.values()) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_no_worse_than_stock(device):
    """Under autocast the residual stream stays fp32 while projections come out bf16: mixed
    dtypes reach the norms and the residual add, which then compute as stock does."""
    model = tiny_model("llama").to(device)
    ids, mask = prompt(device=device)
    reference = logits(model, ids, mask)
    with torch.autocast(device, dtype=torch.bfloat16):
        stock = logits(model, ids, mask)
        lt.apply(model)
        patched = logits(model, ids, mask)
    assert rel(patched, reference, mask) <= 1.1 * rel(stock, reference, mask)


@pytest.mark.parametrize("model_type", ["llama", "gemma"])
def test_norm_eps_is_read_at_call_time(model_type):
    """A norm's eps changed after apply is the one the patched norms (alone and fused with the
    residual add) use, as the stock forward reads it."""
    stock = tiny_model(model_type)
    patched = tiny_model(model_type)
    lt.apply(patched)
    for model in (stock, patched):
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                setattr(module, "variance_epsilon" if hasattr(module, "variance_epsilon") else "eps", 0.5)
    ids, mask = prompt()
    torch.testing.assert_close(logits(patched, ids, mask), logits(stock, ids, mask), rtol=1e-4, atol=1e-4)


def test_version_check():
    lt.check_version("5.17.0")
    with pytest.raises(RuntimeError, match="found transformers 4.57.1"):
        lt.check_version("4.57.1")


def test_not_a_model_raises():
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel"):
        lt.apply(torch.nn.Linear(4, 4))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_cuda_generate_matches_stock_bf16_closely():
    """On the GPU in bf16, greedy tokens track stock for the first steps (ties may flip later)."""
    model = tiny_model("llama").cuda().to(torch.bfloat16)
    ids, mask = prompt(device="cuda")
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        reference = tiny_model("llama").cuda().generate(ids, **kwargs)
        lt.apply(model)
        patched = model.generate(ids, **kwargs)
    assert torch.equal(patched[:, : ids.shape[1] + 1], reference[:, : ids.shape[1] + 1])


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen3", "gemma3_text", "gemma2"])
def test_cuda_decode_steps_run_our_decode_kernel(model_type, cache_kind, monkeypatch):
    """On the GPU in bf16, one-token decode steps against 512 cached keys or more (a padded
    prompt, sliding windows in the mask) run our attention (its decode kernel: the cache read
    once per kv head, no repeat_kv) where transformers would run SDPA; Gemma 2's logit cap keeps
    SDPA. The cached steps' logits are as close to the full forward's as stock's are."""
    ids, mask = prompt(length=600, device="cuda")
    prefill = ids.shape[1] - 3

    def cached_vs_full(model):
        full = logits(model, ids, mask)
        cache = (DynamicCache(config=model.config) if cache_kind == "dynamic"
                 else StaticCache(config=model.config, max_cache_len=ids.shape[1]))
        with torch.no_grad():
            model(input_ids=ids[:, :prefill], attention_mask=mask[:, :prefill], past_key_values=cache)
            steps = [model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache).logits
                     for t in range(prefill, ids.shape[1])]
        return rel(torch.cat(steps, dim=1).float(), full[:, prefill:], mask[:, prefill:])

    # A window that the 600-token prompt overflows but that keeps 512+ keys in the cache (the
    # tiny configs' window of 6 would leave the sliding layers too few keys for the decode kernel).
    window = dict(sliding_window=520) if "sliding_window" in EXTRA.get(model_type, {}) else {}

    def model():
        return tiny_model(model_type, head_dim=64, max_position_embeddings=1024, **window).cuda().to(torch.bfloat16)

    stock = cached_vs_full(model())
    patched = model()
    lt.apply(patched)
    calls = []
    attention = lt.ops.attention
    monkeypatch.setattr(lt.ops, "attention", lambda q, *a, **kw: calls.append(q.shape) or attention(q, *a, **kw))
    ours = cached_vs_full(patched)
    assert ours <= 1.5 * stock + 1e-3, (ours, stock)
    layers = patched.config.num_hidden_layers
    if model_type == "gemma2":
        assert calls == []
    else:
        assert calls == [(2, 6, 1, 64)] * (3 * layers), calls


def test_falcon_compiles_without_graph_breaks():
    """Both paths trace whole: masked (stock's attention) and mask-free (ours)."""
    model = tiny_falcon(**FALCON_VARIANTS["7b"])
    ids, mask = prompt()
    stock = logits(model, ids, mask)
    with torch.no_grad():
        stock_causal = model(input_ids=ids).logits
    apply_quietly(model)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    assert rel(logits(compiled, ids, mask), stock, mask) < 1e-5
    with torch.no_grad():
        assert rel(compiled(input_ids=ids).logits, stock_causal, torch.ones_like(mask)) < 1e-5


# Layers whose mask is SDPA's is_causal for a 14-token prompt: all but those with a sliding
# window shorter than it (Mistral, Phi-3 and Gemma 3's layers, Gemma 2's local one).
MASK_FREE_LAYERS = {"llama": 2, "mistral": 0, "qwen2": 2, "qwen3": 2, "gemma": 2, "gemma2": 1, "gemma3_text": 0,
                    "phi3": 0}


@pytest.mark.parametrize("window", [None, 64])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_plain_causal_mask_left_to_sdpa_under_compile(model_type, window, monkeypatch):
    """Under torch.compile, where transformers always materializes the causal mask, a call with
    no padding mask, no positions and no cache runs SDPA is_causal without a mask in every layer
    whose sliding window (if any) covers the prompt (window=64: all layers); padded, packed and
    cached calls keep the mask. Logits match stock within 1e-5 (fp32) on every path."""
    overrides = {} if window is None or "sliding_window" not in EXTRA.get(model_type, {}) else dict(
        sliding_window=window)
    model = tiny_model(model_type, attn_implementation="sdpa", **overrides)
    ids, mask = prompt()
    ones = torch.ones_like(mask)
    packed = torch.cat([torch.arange(5), torch.arange(ids.shape[1] - 5)]).expand(2, -1)
    calls_of = {"none": {}, "padded": dict(attention_mask=mask), "packed": dict(position_ids=packed)}
    with torch.no_grad():
        stock = {name: model(input_ids=ids, **kw).logits for name, kw in calls_of.items()}
    apply_quietly(model)
    torch._dynamo.reset()  # each model's guards are its own: the earlier tests' count toward the recompile limit
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    calls = sdpa_spy(monkeypatch)
    layers = SIZES["num_hidden_layers"]
    mask_free = layers if overrides else MASK_FREE_LAYERS[model_type]
    with torch.no_grad():
        for name, kw in calls_of.items():
            calls.clear()
            out = compiled(input_ids=ids, **kw).logits
            assert rel(out, stock[name], mask if name == "padded" else ones) < 1e-5, name
            free = [c for c in calls if c.get("attn_mask") is None]
            assert len(calls) == layers and len(free) == (mask_free if name == "none" else 0), (name, calls)
            assert all(c["is_causal"] for c in free)
        # a prompt into a cache runs mask-free; decoding a token after it keeps stock's path
        calls.clear()
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True)
        assert sum(c.get("attn_mask") is None for c in calls) == mask_free
        last = model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True).logits
        assert rel(last, stock["none"][:, -1:], ones[:, -1:]) < 1e-5

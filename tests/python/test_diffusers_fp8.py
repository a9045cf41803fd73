"""inject(..., precision="fp8") on LTX-Video: which linears go FP8, accuracy against the fp32
model, one-way semantics and argument errors. The bf16 default is covered by
test_diffusers_ltx.py and must stay unchanged."""

import copy
import warnings

import pytest
import torch

from conftest import DEVICES, HAS_CUDA, rel_err

pytest.importorskip("diffusers")
import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels import _fp8  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from test_diffusers_ltx import step_kwargs, tiny_model  # noqa: E402
from test_fp8 import block_gemms, count_quantizations, stored_apart  # noqa: E402

# FP8 linears per LTX block: attn1 q/k/v/out, attn2 q/out, FF up and down (attn2's text k/v
# stay in the model's dtype by default: _fp8.DEFAULT_FP8_SKIP says why).
LINEARS_PER_BLOCK = 8
# FP8 e4m3 keeps 3 mantissa bits: one quantized GEMM is ~2.5e-2 off on random data, and the
# tiny model's output, through 2 blocks of residual updates, measured 1.5e-2 to 2.5e-2.
FP8_TOLERANCE = 5e-2


def model16(device, dtype=torch.float32):
    """A tiny LTX model whose block linears have multiples of 16 features (D = 64)."""
    return tiny_model(device, head_dim=16).to(dtype)


def inject_quietly(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lkd.inject(model, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_quantizes_the_block_linears_and_stays_close_to_fp32(device):
    stock = model16(device)
    kw = step_kwargs(stock, "interpolation_scale", per_token=False)
    with torch.no_grad():
        reference = stock(**kw)[0]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = copy.deepcopy(stock).to(dtype)
    report = inject_quietly(model, precision="fp8")
    blocks = len(model.transformer_blocks)
    assert report.patched[_fp8.KIND] == LINEARS_PER_BLOCK * blocks
    assert report.patched[_fp8.FF_KIND] == blocks
    quantized = {name for name, m in model.named_modules() if _fp8.is_quantized(m)}
    assert all(name.startswith("transformer_blocks.") for name in quantized)
    assert model.proj_in.weight.dtype == dtype and model.proj_out.weight.dtype == dtype
    assert model.transformer_blocks[0].attn1.to_q.weight.dtype == torch.float8_e4m3fn
    for block in model.transformer_blocks:
        assert block.attn2.to_q.weight.dtype == block.attn2.to_out[0].weight.dtype == torch.float8_e4m3fn
        assert block.attn2.to_k.weight.dtype == block.attn2.to_v.weight.dtype == dtype
    assert any("FP8 weights" in note for note in report.notes)
    with torch.no_grad():
        out = model(**{k: v.to(dtype) if torch.is_tensor(v) and k.endswith("states") else v for k, v in kw.items()})[0]
    err = rel_err(out, reference)
    assert 0 < err <= FP8_TOLERANCE, err


def test_fp8_quantizes_each_activation_once(monkeypatch):
    """Per block: attn1's q/k/v share one quantization, written by norm1 itself; attn2's q and
    the two attention outputs take one each; the FF's input is written quantized by norm2
    (without a residual: attn2's output projection wrote it), its GELU computed in the up
    projection's GEMM epilogue, and its hidden values quantized plainly for the down
    projection: 6 quantizations for 8 FP8 linears, 4 of them standalone quantize_fp8 passes
    (attn2's text k/v stay in the model's dtype)."""
    model = model16("cpu")
    inject_quietly(model, precision="fp8")
    activations = []
    calls = count_quantizations(monkeypatch, activations)
    with torch.no_grad():
        model(**step_kwargs(model, "interpolation_scale", per_token=False))
    blocks = len(model.transformer_blocks)
    assert len(calls) == 6 * blocks and calls.count("gelu_tanh") == 0
    assert activations == ["gelu_tanh"] * blocks
    assert calls.count("adaln_rms_norm_fp8") == 2 * blocks and "gated_residual_adaln_rms_norm_fp8" not in calls


@pytest.mark.parametrize("per_token", [False, True])
def test_fp8_gemms_write_the_gated_residuals(monkeypatch, per_token):
    """Per block, x + gate * attn1's output, x + attn2's (no gate) and x + gate * the FF's are
    written by the output and down projections' FP8 GEMMs (fp8_linear_gated_residual), not by
    a separate gated_residual pass; with per-token timesteps (one gate row per token) the gated
    two are not, and both stay FP8's distance from the fp32 model."""
    stock = model16("cpu")
    kw = step_kwargs(stock, "interpolation_scale", per_token=per_token)
    with torch.no_grad():
        reference = stock(**kw)[0]
    model = copy.deepcopy(stock)
    inject_quietly(model, precision="fp8")
    calls = []
    for name in ("fp8_linear_gated_residual", "gated_residual"):
        def counting(*args, _op=getattr(_fp8.ops, name), _name=name):
            calls.append(_name)
            return _op(*args)

        monkeypatch.setattr(_fp8.ops, name, counting)
    with torch.no_grad():
        out = model(**kw)[0]
    blocks = len(model.transformer_blocks)
    gated = "gated_residual" if per_token else "fp8_linear_gated_residual"
    assert calls == [gated, "fp8_linear_gated_residual", gated] * blocks
    assert 0 < rel_err(out, reference) <= FP8_TOLERANCE


@pytest.mark.parametrize("target", ["norm1", "norm2", "attn1", "attn1.to_q", "attn1.to_v", "attn1.to_out.0",
                                    "attn1.to_out.1", "attn2", "attn2.to_out.0", "attn2.to_out.1", "ff",
                                    "ff.net.0.proj", "ff.net.2"])
def test_fp8_hooks_on_producers_and_consumers_of_a_quantized_norm_output_run(target):
    """norm1 and norm2 write their outputs quantized only while every consumer is one of our
    FP8 linears, unhooked: a hook on the norm, the attention, a projection or the FF sees its
    call (the norm's output then goes out in the dtype, or quantized by a separate pass; a
    hooked down projection gets the GELU output rounded once more). Likewise attn2's output
    projection writes x + attn2 only while attn2 and it run unhooked (else attn2 runs as a
    module and norm2 adds the residual)."""
    model = model16("cpu")
    inject_quietly(model, precision="fp8")
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    with torch.no_grad():
        fused = model(**kw)[0]
        seen = []
        model.transformer_blocks[0].get_submodule(target).register_forward_hook(lambda m, i, o: seen.append(m))
        hooked = model(**kw)[0]
    assert seen and rel_err(hooked, fused) < 1e-2  # an unfused path may round once more


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("text_kv_fp8", [False, True])
def test_fp8_attention_projections_of_one_input_are_one_gemm(monkeypatch, device, text_kv_fp8):
    """attn1's q/k/v and attn2's text k/v (FP8, or kept in the model's dtype as by default) are
    stored adjacent, in order, in one storage per tensor kind, and each group is computed by
    one GEMM whose output its projections read as strided views; the model's output matches
    the one with each projection stored apart (one GEMM each), which also shows that replaced
    weights leave the group's GEMM."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = model16(device).to(dtype)
    skip = [p for p in _fp8.DEFAULT_FP8_SKIP if not (text_kv_fp8 and p.startswith("*.attn2."))]
    report = inject_quietly(model, precision="fp8", fp8_skip=skip)
    blocks = len(model.transformer_blocks)
    groups = f"{2 * blocks} groups FP8" if text_kv_fp8 else f"{blocks} groups FP8, {blocks} groups in the model's dtype"
    assert any(note.endswith(f"(their weights stored adjacent): {groups}") for note in report.notes), report.notes
    for block in model.transformer_blocks:
        text_kv = (block.attn2.to_k, block.attn2.to_v)
        assert all(_fp8.is_quantized(m) == text_kv_fp8 for m in text_kv)
        for group in ((block.attn1.to_q, block.attn1.to_k, block.attn1.to_v), text_kv):
            for kind in ("weight", "weight_scale", "bias") if _fp8.is_quantized(group[0]) else ("weight", "bias"):
                tensors = [getattr(m, kind) for m in group]
                base = tensors[0].untyped_storage().data_ptr()
                assert all(t.untyped_storage().data_ptr() == base for t in tensors), kind
                offsets = [t.storage_offset() for t in tensors]
                assert offsets == [offsets[0] + sum(t.numel() for t in tensors[:i]) for i in range(len(tensors))]
        assert block.attn1.to_q.weight.untyped_storage().data_ptr() != block.attn2.to_q.weight.untyped_storage().data_ptr()
    apart = copy.deepcopy(model)
    stored_apart(apart)
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    kw = {k: v.to(dtype) if torch.is_tensor(v) and k.endswith("states") else v for k, v in kw.items()}
    with torch.no_grad():
        with monkeypatch.context() as patched:
            grouped = block_gemms(patched, model)
            out = model(**kw)[0]
        separate = block_gemms(monkeypatch, apart)
        ref = apart(**kw)[0]
    # per block: attn1's q/k/v, attn2's q, its text k/v, the FF's up projection (the output
    # projections write their residuals through fp8_linear_gated_residual)
    D = model.transformer_blocks[0].attn1.to_q.out_features
    assert grouped == [(f"{i}.{name}", width) for i in range(blocks)
                       for name, width in (("attn1.to_q", 3 * D), ("attn2.to_q", D), ("attn2.to_k", 2 * D),
                                           ("ff.net.0.proj", 4 * D))]
    assert separate == [(f"{i}.{name}", width) for i in range(blocks)
                        for name, width in (("attn1.to_q", D), ("attn1.to_k", D), ("attn1.to_v", D),
                                            ("attn2.to_q", D), ("attn2.to_k", D), ("attn2.to_v", D),
                                            ("ff.net.0.proj", 4 * D))]
    if device == "cpu":
        assert torch.equal(out, ref)
    else:  # (one GEMM per width; the launcher may tile them apart)
        assert rel_err(out, ref) <= 1e-2


def test_fp8_skip_keeps_matching_linears():
    model = model16("cpu")
    inject_quietly(model, precision="fp8", fp8_skip=[*_fp8.DEFAULT_FP8_SKIP, "*.ff.*"])
    assert model.transformer_blocks[0].ff.net[2].weight.dtype == torch.float32
    assert _fp8.is_quantized(model.transformer_blocks[0].attn2.to_q)
    assert not _fp8.is_quantized(model.transformer_blocks[0].attn2.to_v)  # a default pattern


def test_fp8_skip_without_the_defaults_quantizes_the_text_projections():
    model = model16("cpu")
    inject_quietly(model, precision="fp8", fp8_skip=[])
    assert _fp8.is_quantized(model.transformer_blocks[0].attn2.to_k)
    assert _fp8.is_quantized(model.transformer_blocks[0].attn2.to_v)


def test_features_not_multiple_of_16_stay_bf16_and_are_reported():
    model = tiny_model("cpu", head_dim=10)  # D = 40
    report = inject_quietly(model, precision="fp8")
    assert report.patched[_fp8.KIND] == 0
    assert any("not multiples of 16" in reason for reason in report.skipped)
    with torch.no_grad():
        assert torch.isfinite(model(**step_kwargs(model, "interpolation_scale", per_token=False))[0]).all()


def test_fp8_is_one_way_and_precisions_do_not_mix():
    model = model16("cpu")
    with pytest.raises(ValueError, match="inject: precision must be 'bf16' or 'fp8'"):
        lkd.inject(model, precision="int4")
    with pytest.raises(TypeError, match="fp8_skip"):
        lkd.inject(model, precision="fp8", fp8_skip="proj_in")
    assert not any(is_patched(m) for m in model.modules())  # nothing changed
    inject_quietly(model)
    with pytest.raises(ValueError, match="already patched with precision='bf16'"):
        lkd.inject(model, precision="fp8")
    lkd.remove(model)
    inject_quietly(model, precision="fp8")
    weights = {name: p.clone() for name, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="one-way"):
        lkd.remove(model)
    with pytest.raises(ValueError, match="was patched with precision='fp8'"):
        lkd.inject(model)
    again = inject_quietly(model, precision="fp8")
    assert sum(again.patched.values()) == 0
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())


def test_fp8_compiles_fullgraph():
    model = model16("cpu")
    inject_quietly(model, precision="fp8")
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(**kw)[0]
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(**kw)[0]
    torch.testing.assert_close(compiled, eager)


def test_fp8_refuses_gpus_without_fp8_before_changing_the_model(monkeypatch):
    """An sm_80 GPU (faked: the check reads only devices and capabilities) is refused by name."""
    model = model16("cpu")
    monkeypatch.setattr(_fp8, "_cuda_devices", lambda m, dtype=None: {torch.device("cuda", 0)})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(RuntimeError, match="A100 on cuda:0 has compute capability 8.0"):
        lkd.inject(model, precision="fp8")
    assert not any(is_patched(m) for m in model.modules())
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bf16_refused_on_gpus_without_it_before_changing_the_model(monkeypatch, dtype):
    """A T4 (compute capability 7.5, faked: the check reads only devices and capabilities)
    has no bfloat16: a bf16 model is refused by name, unchanged; an fp16 one is patched."""
    model = model16("cpu").to(dtype)
    monkeypatch.setattr(_fp8, "_cuda_devices", lambda m, of=None: {torch.device("cuda", 0)} if of in (None, dtype) else set())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    if dtype == torch.float16:
        assert inject_quietly(model).patched
        return
    with pytest.raises(ValueError, match=r"bfloat16 parameters on Tesla T4 \(cuda:0, compute capability 7.5\)"):
        lkd.inject(model)
    assert not any(is_patched(m) for m in model.modules())


def test_train_mode_report_says_what_is_forward_only():
    """In train mode the bf16 inject has a backward everywhere; the FP8 linears do not, and the
    report says so, naming them."""
    report = inject_quietly(model16("cpu").train())
    assert any("train mode: every patched module has a backward" in note for note in report.notes), report.notes
    report = inject_quietly(model16("cpu").train(), precision="fp8")
    assert any("train mode" in note and "forward-only" in note and "fp8_linear" in note for note in report.notes)


def test_fp8_leaves_lora_layers_in_the_model_dtype():
    """Linears inside a peft adapter (base layer and LoRA matrices) stay unquantized: peft
    merges and scales them in the weight's dtype. The rest goes FP8 and the model runs."""
    peft = pytest.importorskip("peft")
    model = model16("cpu")
    model.add_adapter(peft.LoraConfig(r=16, target_modules=["to_q"], init_lora_weights=False))
    report = inject_quietly(model, precision="fp8")
    to_q = model.transformer_blocks[0].attn1.to_q
    assert to_q.base_layer.weight.dtype == torch.float32 and not _fp8.is_quantized(to_q.lora_A["default"])
    assert _fp8.is_quantized(model.transformer_blocks[0].attn1.to_k)
    assert any("inside the peft adapter layer" in reason for reason in report.skipped)
    with torch.no_grad():
        assert torch.isfinite(model(**step_kwargs(model, "interpolation_scale", per_token=False))[0]).all()


# Every place an LTX block calls a linear: self-attention q/k/v (shared quantization),
# cross-attention q alone, attention output, FF up (fused with its GELU) and down.
@pytest.mark.parametrize("target", ["attn1.to_k", "attn2.to_q", "to_out.0", "ff.net.0.proj", "ff.net.2"])
@torch.no_grad()
def test_lora_added_after_fp8_raises_naming_both(target):
    """peft casts the LoRA matrices to the base weight's dtype (e4m3), where they cannot run:
    the forward says so and how to order the two, instead of failing inside peft."""
    peft = pytest.importorskip("peft")
    model = model16("cpu")
    inject_quietly(model, precision="fp8")
    model.add_adapter(peft.LoraConfig(r=4, target_modules=[target], init_lora_weights=False))
    with pytest.raises(RuntimeError, match=r"peft adapter layer .* precision='fp8'.* before patching"):
        model(**step_kwargs(model, "interpolation_scale", per_token=False))


def test_fp8_on_an_accelerate_offloaded_model_raises_naming_both():
    """accelerate keeps the offloaded weights in its own map and reloads them for each forward:
    quantizing the meta-device parameters would be undone (or crash), so inject refuses first."""
    accelerate = pytest.importorskip("accelerate")
    model = model16("cpu")
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"precision='fp8' cannot quantize .* offloaded by accelerate"):
        lkd.inject(model, precision="fp8")
    assert not any(is_patched(m) for m in model.modules())


@torch.no_grad()
def test_fp8_with_first_block_cache_and_compile():
    """The fastest recipe's stack on the CPU: FP8 + FirstBlockCache (either order gives the same
    model; the cache is active; each call within FP8's error of stock with the cache) +
    torch.compile (aot_eager: reproduces eager)."""
    from test_diffusers_compose import FEATURES, denoise, max_rel_err

    base = model16("cpu")
    kw = step_kwargs(base, "interpolation_scale", per_token=False)
    stock = copy.deepcopy(base)
    FEATURES["first_block_cache"](stock)
    expected = denoise(stock, kw)
    no_cache = copy.deepcopy(base)
    inject_quietly(no_cache, precision="fp8")
    runs = {}
    for order in ("cache_then_fp8", "fp8_then_cache"):
        model = copy.deepcopy(base)
        if order == "cache_then_fp8":
            FEATURES["first_block_cache"](model)
        inject_quietly(model, precision="fp8")
        if order == "fp8_then_cache":
            FEATURES["first_block_cache"](model)
        runs[order] = denoise(model, kw)
    outputs = runs["fp8_then_cache"]
    assert all(torch.equal(a, b) for a, b in zip(outputs, runs["cache_then_fp8"]))
    assert max_rel_err(outputs, denoise(no_cache, kw)) > 1e-2  # the cache is active
    assert max_rel_err(outputs, expected) < FP8_TOLERANCE
    torch._dynamo.reset()
    assert max_rel_err(denoise(torch.compile(model, backend="aot_eager"), kw), outputs) < 1e-6


def test_fidelity_benchmark_fp8_skip_adds_to_the_default():
    """``python -m ltx_kernels.bench.fidelity --fp8-skip ...``: the FP8 modes keep the given
    linears in bf16 besides inject's default ones (the sweep of fidelity_fp8_skip.md)."""
    from ltx_kernels.bench import fidelity

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = fidelity._prepare(model16("cpu"), "ours-fp8", ("*.ff.*",))
    block = model.transformer_blocks[0]
    assert _fp8.is_quantized(block.attn1.to_q) and _fp8.is_quantized(block.attn2.to_out[0])
    assert not _fp8.is_quantized(block.ff.net[2]) and not _fp8.is_quantized(block.attn2.to_k)

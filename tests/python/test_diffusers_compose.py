"""ltx_kernels.diffusers.inject composed with the features diffusers users turn on, in
either order: the cache methods, layerwise casting, group offloading, other hooks on the
submodules whose weights the fused kernels read, attention processors and backends (also
the ``attention_backend(...)`` context manager), peft LoRA adapters and what users do with
them, a torchao-quantized base model, and torch.compile on top of these.

Each hook case runs a tiny fp32 LTX transformer through 6 denoising calls (falling timesteps,
each in a ``cache_context`` with its step, as the pipelines do) with the feature on, patched
against stock with the same feature. Patched runs use ``rope="stock"`` (diffusers' own RoPE
tables), so they agree with stock to fp32 rounding (~2e-7 relative per call) and a dropped
feature (a cache that no longer skips, weights read without their casting hook) shows as a
difference of 1e-2 or more. After ``remove()`` the model must reproduce stock-with-feature
bit for bit. LoRA, quantization and backend cases compare single calls the same way.
"""

import copy
import itertools
from collections import Counter

import pytest
import torch

from conftest import rel_err

pytest.importorskip("diffusers")
import ltx_kernels.diffusers as lkd  # noqa: E402
from diffusers.hooks import (  # noqa: E402
    FasterCacheConfig,
    FirstBlockCacheConfig,
    HookRegistry,
    MagCacheConfig,
    ModelHook,
    PyramidAttentionBroadcastConfig,
    SeaCacheConfig,
    TaylorSeerCacheConfig,
)
from diffusers.hooks.group_offloading import GroupOffloadingHook  # noqa: E402
from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor  # noqa: E402
from test_diffusers_ltx import step_kwargs, tiny_model  # noqa: E402

TIMESTEPS = (999, 800, 600, 400, 200, 50)
TOLERANCE = 1e-5  # relative, per call: fp32 rounding with rope="stock"
PATCHED = 9  # 2 blocks x (block, attn1, attn2), the model forward, 2 feed-forward GELUs
_now = {"timestep": None}  # the pipeline's current timestep, for PAB and FasterCache


def _latents(model, args, kwargs):
    """SeaCache's view of LTX's packed [B, F*H*W, C] latents: [C, F, H, W] per sample."""
    f, h, w = kwargs["num_frames"], kwargs["height"], kwargs["width"]
    return [x.T.reshape(-1, f, h, w) for x in kwargs["hidden_states"]]


class _ScaleOutput(ModelHook):
    """A hook that replaces a forward (``new_forward``, as layer skip and the caches do)."""

    def new_forward(self, module, *args, **kwargs):
        return self.fn_ref.original_forward(*args, **kwargs) * 1.5


_FUSED_READS = ("norm1", "norm2", "norm_q", "norm_k", "ff.net.0.proj")  # weights read in place


def _hook_fused_reads(model, hook):
    for name, module in model.named_modules():
        if name.endswith(_FUSED_READS):
            hook(module)


# Every cache config of diffusers 0.42.1 that runs on LTX (TextKVCacheConfig hooks
# NucleusMoE blocks only), then the other features built on its hooks.
FEATURES = {
    "first_block_cache": lambda model: model.enable_cache(FirstBlockCacheConfig(threshold=0.2)),
    "taylorseer": lambda model: model.enable_cache(TaylorSeerCacheConfig(
        cache_interval=2, disable_cache_before_step=1, taylor_factors_dtype=torch.float32,
        cache_identifiers=[r"transformer_blocks\.\d+"],  # its default patterns match no LTX module
    )),
    "pyramid_attention_broadcast": lambda model: model.enable_cache(PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2, current_timestep_callback=lambda: _now["timestep"]
    )),
    "faster_cache": lambda model: model.enable_cache(FasterCacheConfig(
        spatial_attention_block_skip_range=2, current_timestep_callback=lambda: _now["timestep"],
        is_guidance_distilled=True,  # LTX's CFG batch is not split the way FasterCache expects
    )),
    "mag_cache": lambda model: model.enable_cache(MagCacheConfig(
        num_inference_steps=len(TIMESTEPS), mag_ratios=torch.ones(len(TIMESTEPS)), threshold=0.5, retention_ratio=0.2
    )),
    "sea_cache": lambda model: model.enable_cache(SeaCacheConfig(threshold=1.0, raw_vision_callback=_latents)),
    "layerwise_casting_fp8": lambda model: model.enable_layerwise_casting(
        storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32
    ),
    "group_offload_block_level": lambda model: model.enable_group_offload(
        torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1
    ),
    "group_offload_leaf_level": lambda model: model.enable_group_offload(
        torch.device("cpu"), offload_type="leaf_level"
    ),
    "new_forward_hook_on_fused_reads": lambda model: _hook_fused_reads(
        model, lambda m: HookRegistry.check_if_exists_or_initialize(m).register_hook(_ScaleOutput(), "scale")
    ),
    "torch_forward_hook_on_fused_reads": lambda model: _hook_fused_reads(
        model, lambda m: m.register_forward_hook(lambda module, args, output: output * 1.5)
    ),
}


def denoise(model, kw):
    outputs = []
    for step, t in enumerate(TIMESTEPS):
        _now["timestep"] = t
        with model.cache_context("cond", step_index=step, sigma=t / 1000, num_inference_steps=len(TIMESTEPS)):
            outputs.append(model(**dict(kw, timestep=torch.full_like(kw["timestep"], t)))[0])
    model._reset_stateful_cache()  # the next run starts afresh, as a pipeline call does
    return outputs


def max_rel_err(outputs, expected):
    return max(rel_err(o, e) for o, e in zip(outputs, expected))


@pytest.fixture
def offload_calls(monkeypatch):
    """Counts GroupOffloadingHook.pre_forward calls (onloads on a real device)."""
    calls = Counter()
    pre_forward = GroupOffloadingHook.pre_forward

    def counted(self, module, *args, **kwargs):
        calls["pre_forward"] += 1
        return pre_forward(self, module, *args, **kwargs)

    monkeypatch.setattr(GroupOffloadingHook, "pre_forward", counted)
    return calls


@pytest.mark.parametrize("order", ["feature_then_inject", "inject_then_feature"])
@pytest.mark.parametrize("feature", FEATURES)
@torch.no_grad()
def test_feature_composes_with_inject(feature, order, offload_calls):
    base = tiny_model("cpu", affine=True)  # norm1/norm2 with weights: fused reads everywhere
    kw = step_kwargs(base, "interpolation_scale", per_token=False)
    plain = denoise(base, kw)

    stock = copy.deepcopy(base)
    FEATURES[feature](stock)
    expected = denoise(stock, kw)
    stock_calls = offload_calls["pre_forward"]
    if not feature.startswith("group_offload"):  # the feature changes the output: it is active
        assert max_rel_err(expected, plain) > 1e-2, "the feature does nothing here: the test would prove nothing"

    model = copy.deepcopy(base)
    if order == "feature_then_inject":
        FEATURES[feature](model)
    report = lkd.inject(model, rope="stock")
    if order == "inject_then_feature":
        FEATURES[feature](model)
    assert sum(report.patched.values()) == PATCHED and not report.skipped, report

    offload_calls.clear()
    outputs = denoise(model, kw)
    assert max_rel_err(outputs, expected) < TOLERANCE
    assert not torch.equal(outputs[0], expected[0]), "our kernels did not run"
    assert offload_calls["pre_forward"] == stock_calls  # every group onloaded as often as stock
    if feature == "layerwise_casting_fp8":  # the casting hook ran around the fused read: fp8 again
        assert model.transformer_blocks[0].ff.net[0].proj.weight.dtype == torch.float8_e4m3fn

    assert lkd.remove(model) == PATCHED
    assert not any("_ltx_kernels_patch" in m.__dict__ for m in model.modules())
    assert all(torch.equal(o, e) for o, e in zip(denoise(model, kw), expected))


_NESTED = {
    "cache": lambda model: model.enable_cache(FirstBlockCacheConfig(threshold=0.2)),
    "accelerate_offload": lambda model: pytest.importorskip("accelerate").cpu_offload(
        model, execution_device=torch.device("cpu")  # what enable_sequential_cpu_offload installs
    ),
    "inject": lambda model: lkd.inject(model, rope="stock"),
}


@pytest.mark.parametrize("order", list(itertools.permutations(_NESTED)), ids="-".join)
@torch.no_grad()
def test_diffusers_and_accelerate_hooks_nested(order):
    """diffusers' registry and accelerate's hooks wrapping each other on the same modules
    (accelerate moves the weights to the meta device), with inject anywhere in between."""
    base = tiny_model("cpu", affine=True)
    kw = step_kwargs(base, "interpolation_scale", per_token=False)
    stock = copy.deepcopy(base)
    _NESTED["cache"](stock)
    _NESTED["accelerate_offload"](stock)
    expected = denoise(stock, kw)
    assert max_rel_err(expected, denoise(base, kw)) > 1e-2  # the cache is active

    model = copy.deepcopy(base)
    for step in order:
        _NESTED[step](model)
    assert model.transformer_blocks[0].attn1.norm_q.weight.device.type == "meta"
    outputs = denoise(model, kw)
    assert max_rel_err(outputs, expected) < TOLERANCE
    assert not torch.equal(outputs[0], expected[0]), "our kernels did not run"
    assert lkd.remove(model) == PATCHED
    assert all(torch.equal(o, e) for o, e in zip(denoise(model, kw), expected))


@pytest.mark.parametrize("order", ["cache_inject_disable", "inject_cache_disable"])
@torch.no_grad()
def test_disable_cache_after_inject(order):
    """Removing a hook relinks the chain around our forward: the cache is gone, our forward
    stays, remove() still finds it."""
    base = tiny_model("cpu", affine=True)
    kw = step_kwargs(base, "interpolation_scale", per_token=False)
    expected = denoise(base, kw)
    model = copy.deepcopy(base)
    for step in order.split("_"):
        if step == "cache":
            FEATURES["first_block_cache"](model)
        elif step == "inject":
            lkd.inject(model, rope="stock")
        else:
            model.disable_cache()
    outputs = denoise(model, kw)
    assert max_rel_err(outputs, expected) < TOLERANCE and not torch.equal(outputs[0], expected[0])
    assert lkd.remove(model) == PATCHED
    assert not any("forward" in m.__dict__ for m in model.modules())  # stock, no wrapper left
    assert all(torch.equal(o, e) for o, e in zip(denoise(model, kw), expected))


@pytest.mark.parametrize("where", ["set_attn_processor", "one_block"])
@torch.no_grad()
def test_stock_processor_set_after_inject(where):
    """A processor set after inject gets diffusers' RoPE tables (here with the default
    rope="exact": only our processor takes positions) and stays after remove()."""
    model = tiny_model("cpu")
    kw = step_kwargs(model, "raw_grid", per_token=False)
    expected = model(**kw)[0]
    lkd.inject(model)
    processor = LTXVideoAttnProcessor()
    if where == "set_attn_processor":
        model.set_attn_processor(processor)
    else:
        model.transformer_blocks[1].attn1.set_processor(processor)
    assert rel_err(model(**kw)[0], expected) < TOLERANCE

    lkd.remove(model)
    assert model.transformer_blocks[1].attn1.processor is processor
    assert torch.equal(model(**kw)[0], expected)


@torch.no_grad()
def test_set_attention_backend_after_inject_reaches_processors():
    from diffusers.models.attention_dispatch import AttentionBackendName

    model = tiny_model("cpu")
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    lkd.inject(model)
    model.set_attention_backend("native")  # the default backend: leaves global state as it was
    processor = model.transformer_blocks[0].attn1.processor
    assert type(processor).__name__ == "LtxKernelsAttnProcessor"
    assert processor._attention_backend == AttentionBackendName.NATIVE
    model(**kw)
    lkd.remove(model)
    processor = model.transformer_blocks[0].attn1.processor
    assert type(processor) is LTXVideoAttnProcessor
    assert processor._attention_backend == AttentionBackendName.NATIVE


@pytest.mark.parametrize("positions", ["interpolation_scale", "raw_grid", "video_coords"])
@torch.no_grad()
def test_rope_argument(positions):
    stock = tiny_model("cpu")
    kw = step_kwargs(stock, positions, per_token=False)
    expected = stock(**kw)[0]
    exact, tables = copy.deepcopy(stock), copy.deepcopy(stock)
    lkd.inject(exact)
    lkd.inject(tables, rope="stock")
    assert rel_err(tables(**kw)[0], expected) < 1e-6
    # In-kernel fp64 angles against diffusers' fp32 tables (inject's docstring says why).
    assert 1e-6 < rel_err(exact(**kw)[0], expected) < 2e-3
    with pytest.raises(ValueError, match="rope"):
        lkd.inject(copy.deepcopy(stock), rope="fast")


# --- peft LoRA -----------------------------------------------------------------------------
# LTX's block linears: attention q/k/v/out (attn1 and attn2) and the FF up/down projections.
LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]
FF_UP = "ff.net.0.proj"  # the projection that linear_gelu_tanh computes with its GELU


def add_lora(model):
    """Two adapters with non-zero weights, drawn from their own generator (the same in any
    order of adding them and inject): "all" on every block linear, "ff" on the FF
    projections with a large delta (alpha / r = 16), so a FF up projection computed without
    its LoRA layer (a fused GEMM reading the base weight) would be off by far more than the
    tolerance. Both active."""
    from peft import LoraConfig

    model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=LORA_TARGETS, init_lora_weights=False), "all")
    model.add_adapter(
        LoraConfig(r=4, lora_alpha=64, target_modules=[FF_UP, "ff.net.2"], init_lora_weights=False), "ff"
    )
    g = torch.Generator().manual_seed(1)
    for name, p in sorted(model.named_parameters()):
        if ".lora_" in name:
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    model.set_adapters(["all", "ff"])


# Steps a LoRA user takes after loading adapters, applied in turn to stock and patched; the
# output is compared after each. "scale" is a call argument (diffusers' apply_lora_scale).
LORA_STEPS = {
    "set_adapters_weights": lambda m: m.set_adapters(["all", "ff"], [0.5, 2.0]),
    "fuse_lora": lambda m: m.fuse_lora(lora_scale=0.5),
    "unfuse_lora": lambda m: m.unfuse_lora(),
    "disable_adapters": lambda m: m.disable_adapters(),
    "enable_adapters": lambda m: m.enable_adapters(),
    "delete_adapters_ff": lambda m: m.delete_adapters("ff"),
    "unload_lora": lambda m: m.unload_lora(),
    "scale": None,
}
LORA_SEQUENCES = {
    "scale": ["scale"],
    "set_adapters": ["set_adapters_weights"],
    "fuse_unfuse": ["fuse_lora", "unfuse_lora"],
    "disable_enable": ["disable_adapters", "enable_adapters"],
    "delete_then_unload": ["delete_adapters_ff", "unload_lora"],
}


@pytest.fixture
def fused_ff_calls(monkeypatch):
    """Counts linear_gelu_tanh calls (the FF up projection fused with its GELU)."""
    calls = Counter()
    fused = lkd.ops.linear_gelu_tanh

    def counted(x, weight, bias):
        calls["linear_gelu_tanh"] += 1
        return fused(x, weight, bias)

    monkeypatch.setattr(lkd.ops, "linear_gelu_tanh", counted)
    return calls


def _ff_has_lora(model) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return isinstance(model.transformer_blocks[0].ff.net[0].proj, BaseTunerLayer)


def _lora_step(model, name) -> dict:
    """Applies one LoRA step to ``model``; returns the call arguments it needs."""
    if name == "scale":
        return {"attention_kwargs": {"scale": 0.5}}
    LORA_STEPS[name](model)
    return {}


def _check_lora(model, stock, kw, call_kw):
    """Patched against stock with the same adapters and steps; returns stock's output."""
    expected, out = stock(**kw, **call_kw)[0], model(**kw, **call_kw)[0]
    assert rel_err(out, expected) < TOLERANCE
    assert not torch.equal(out, expected), "our kernels did not run"
    return expected


def _lora_models():
    base = tiny_model("cpu", affine=True)
    kw = step_kwargs(base, "interpolation_scale", per_token=False)
    stock = copy.deepcopy(base)
    add_lora(stock)
    return base, stock, kw


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`")  # peft, on the second adapter
@torch.no_grad()
def test_peft_lora_adapters_are_active():
    """What the LoRA tests below rely on: the adapters change the output, the FF's by far."""
    pytest.importorskip("peft")
    base, stock, kw = _lora_models()
    without_ff = copy.deepcopy(stock)
    without_ff.set_adapters("all")
    lora = stock(**kw)[0]
    assert rel_err(lora, base(**kw)[0]) > 1e-2
    assert rel_err(lora, without_ff(**kw)[0]) > 0.5, "the FF adapter's delta is not large"


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`")
@pytest.mark.parametrize("order", ["lora_then_inject", "inject_then_lora"])
@pytest.mark.parametrize("sequence", LORA_SEQUENCES)
@torch.no_grad()
def test_peft_lora_steps_after_inject(sequence, order, fused_ff_calls):
    pytest.importorskip("peft")
    base, stock, kw = _lora_models()
    model = copy.deepcopy(base)
    if order == "lora_then_inject":
        add_lora(model)
    report = lkd.inject(model, rope="stock")
    if order == "inject_then_lora":
        add_lora(model)
    assert sum(report.patched.values()) == PATCHED and not report.skipped, report

    outputs = [_check_lora(model, stock, kw, {})]
    for name in LORA_SEQUENCES[sequence]:
        call_kw = _lora_step(stock, name)
        _lora_step(model, name)
        fused_ff_calls.clear()
        outputs.append(_check_lora(model, stock, kw, call_kw))
        # The FF's fused GEMM + GELU runs only where no LoRA layer wraps the projection.
        assert fused_ff_calls["linear_gelu_tanh"] == (0 if _ff_has_lora(model) else 2)
        if name == "unfuse_lora":  # unmerged, at the scale fuse_lora(0.5) left: the same output
            assert not model.transformer_blocks[0].ff.net[0].proj.merged
        else:
            assert rel_err(outputs[-1], outputs[-2]) > 1e-2, f"{name} changed nothing"
    if sequence == "scale":
        _check_lora(model, stock, kw, {})  # a call's scale does not stay
    assert lkd.remove(model) == PATCHED
    assert torch.equal(model(**kw)[0], stock(**kw)[0])


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`")
@pytest.mark.parametrize("sequence", LORA_SEQUENCES)
@torch.no_grad()
def test_peft_lora_steps_before_inject(sequence):
    pytest.importorskip("peft")
    base, stock, kw = _lora_models()
    model = copy.deepcopy(base)
    add_lora(model)
    for name in LORA_SEQUENCES[sequence]:
        call_kw = _lora_step(stock, name)
        _lora_step(model, name)
    report = lkd.inject(model, rope="stock")
    assert sum(report.patched.values()) == PATCHED and not report.skipped, report
    _check_lora(model, stock, kw, call_kw)


# --- a quantized base model (torchao) --------------------------------------------------------
def _attention_linears(module, name):
    return isinstance(module, torch.nn.Linear) and ".attn" in name


def _int8_weight_only(model, only_attention=False):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model, Int8WeightOnlyConfig(), filter_fn=_attention_linears if only_attention else None)


@pytest.mark.parametrize("order", ["quantize_then_inject", "inject_then_quantize"])
@pytest.mark.parametrize("linears", ["all", "attention_only"])
@torch.no_grad()
def test_torchao_int8_weight_only_base_model(linears, order, fused_ff_calls):
    """Quantized linears stay with torchao: the FF's fused GEMM never reads an Int8Tensor (the
    projection runs torchao's linear, then our gelu_tanh); every other fused op still runs."""
    pytest.importorskip("torchao")
    from ltx_kernels._patching import is_library_tensor

    only_attention = linears == "attention_only"
    base = tiny_model("cpu", affine=True)
    kw = step_kwargs(base, "interpolation_scale", per_token=False)
    stock = copy.deepcopy(base)
    _int8_weight_only(stock, only_attention)
    expected = stock(**kw)[0]
    assert rel_err(expected, base(**kw)[0]) > 1e-3  # int8 weights: the quantization is active

    model = copy.deepcopy(base)
    if order == "quantize_then_inject":
        _int8_weight_only(model, only_attention)
    report = lkd.inject(model, rope="stock")
    if order == "inject_then_quantize":
        _int8_weight_only(model, only_attention)
    assert sum(report.patched.values()) == PATCHED and not report.skipped, report
    ff_up = model.transformer_blocks[0].ff.net[0].proj
    assert is_library_tensor(model.transformer_blocks[0].attn1.to_q.weight)
    assert is_library_tensor(ff_up.weight) != only_attention
    if order == "quantize_then_inject":  # the report names what stays with torchao
        (note,) = [n for n in report.notes if "Int8Tensor" in n]
        assert "transformer_blocks.*.attn1.to_q (2)" in note and (FF_UP in note) != only_attention

    out = model(**kw)[0]
    assert rel_err(out, expected) < TOLERANCE
    assert not torch.equal(out, expected), "our kernels did not run"
    assert fused_ff_calls["linear_gelu_tanh"] == (2 if only_attention else 0)
    assert lkd.remove(model) == PATCHED
    assert torch.equal(model(**kw)[0], expected)


@torch.no_grad()
def test_fp8_inject_leaves_torchao_linears_alone():
    """inject(precision="fp8") on a torchao-quantized model: torchao's linears stay torchao's
    (reported in report.skipped, warned), the plain ones go FP8."""
    pytest.importorskip("torchao")
    from ltx_kernels import _fp8

    stock = tiny_model("cpu", head_dim=16)  # D = 64: FP8-sized linears
    _int8_weight_only(stock, only_attention=True)
    kw = step_kwargs(stock, "interpolation_scale", per_token=False)
    expected = stock(**kw)[0]
    model = copy.deepcopy(stock)
    with pytest.warns(UserWarning, match="left to their library, not FP8"):
        report = lkd.inject(model, precision="fp8")
    blocks = model.transformer_blocks
    assert report.patched[_fp8.KIND] == 2 * len(blocks)  # the FF's up and down projections
    assert all(_fp8.is_quantized(block.ff.net[2]) for block in blocks)
    assert not any(_fp8.is_quantized(m) for name, m in model.named_modules() if ".attn" in name)
    assert type(blocks[0].attn1.to_q.weight).__name__ == "Int8Tensor"
    assert 0 < rel_err(model(**kw)[0], expected) < 5e-2  # FP8's error (test_diffusers_fp8.py)


# --- diffusers' attention_backend(...) context manager ---------------------------------------
@pytest.mark.parametrize("order", ["inject_then_context", "context_then_inject"])
@torch.no_grad()
def test_attention_backend_context_manager_reaches_our_processor(order, monkeypatch):
    """``with attention_backend(name):`` sets the active backend; our processor (no backend
    of its own set) dispatches to it, as the stock processor does."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, attention_backend

    name = AttentionBackendName._NATIVE_MATH  # runs on the CPU; SDPA's math kernel
    calls = Counter()
    backend = _AttentionBackendRegistry._backends[name]

    def counted(**kwargs):
        calls[name] += 1
        return backend(**kwargs)

    monkeypatch.setitem(_AttentionBackendRegistry._backends, name, counted)
    base = tiny_model("cpu")
    kw = step_kwargs(base, "interpolation_scale", per_token=False)
    with attention_backend(name):
        expected = base(**kw)[0]
    assert calls[name] == 4  # 2 blocks x (attn1, attn2): the stock processors use it

    model = copy.deepcopy(base)
    if order == "inject_then_context":
        lkd.inject(model, rope="stock")
    calls.clear()
    with attention_backend(name):
        if order == "context_then_inject":
            lkd.inject(model, rope="stock")
        out = model(**kw)[0]
    assert calls[name] == 4
    assert rel_err(out, expected) < TOLERANCE and not torch.equal(out, expected)
    model(**kw)
    assert calls[name] == 4  # the context is left: the default backend again


# --- torch.compile on top --------------------------------------------------------------------
# (feature, order, fullgraph): one order per feature (a compile costs 4 to 10 s of CPU here;
# the eager tests above cover both orders). fullgraph=False where the stock model with the
# feature does not compile in one graph either:
# - first_block_cache: the hook decides on the host whether to skip the remaining blocks
#   (FBCHeadBlockHook._should_compute_remaining_blocks is torch.compiler.disable'd: a graph
#   break per step, by design: the decision is data-dependent);
# - layerwise_casting_fp8: LayerwiseCastingHook casts with module.to(dtype) around every
#   forward, which builds new nn.Parameter objects; Dynamo refuses that in a graph.
# new_forward hooks on the fused reads: our forward calls the hooked modules (the unfused
# path) under Dynamo, which once broke on reading the hook wrapper's closure.
COMPILE_CASES = [
    ("first_block_cache", "feature_then_inject", False),
    ("lora", "inject_then_feature", True),
    ("layerwise_casting_fp8", "inject_then_feature", False),
    ("new_forward_hook_on_fused_reads", "feature_then_inject", True),
]
COMPILE_FEATURES = {**FEATURES, "lora": add_lora}


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`")
@pytest.mark.parametrize("feature,order,fullgraph", COMPILE_CASES, ids=[f"{c[0]}-{c[1]}" for c in COMPILE_CASES])
@torch.no_grad()
def test_torch_compile_on_top(feature, order, fullgraph):
    """torch.compile (aot_eager: Dynamo + AOT tracing, the kernels run as eager) of a patched
    model with a feature: the compiled denoising loop reproduces the eager one."""
    if feature == "lora":
        pytest.importorskip("peft")
    torch._dynamo.reset()
    base = tiny_model("cpu", affine=True)
    kw = step_kwargs(base, "interpolation_scale", per_token=False)
    plain = denoise(base, kw)
    stock = copy.deepcopy(base)
    COMPILE_FEATURES[feature](stock)
    expected = denoise(stock, kw)
    assert max_rel_err(expected, plain) > 1e-2  # the feature is active

    model = copy.deepcopy(base)
    if order == "feature_then_inject":
        COMPILE_FEATURES[feature](model)
    lkd.inject(model, rope="stock")
    if order == "inject_then_feature":
        COMPILE_FEATURES[feature](model)
    eager = denoise(model, kw)
    compiled = denoise(torch.compile(model, fullgraph=fullgraph, backend="aot_eager"), kw)
    assert max_rel_err(compiled, eager) < 1e-6
    assert max_rel_err(compiled, expected) < TOLERANCE
    assert not torch.equal(compiled[0], expected[0]), "our kernels did not run"

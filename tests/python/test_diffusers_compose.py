"""ltx_kernels.diffusers.inject composed with the features diffusers users turn on, in
either order: the cache methods, layerwise casting, group offloading, other hooks on the
submodules whose weights the fused kernels read, attention processors and backends.

Each case runs a tiny fp32 LTX transformer through 6 denoising calls (falling timesteps,
each in a ``cache_context`` with its step, as the pipelines do) with the feature on, patched
against stock with the same feature. Patched runs use ``rope="stock"`` (diffusers' own RoPE
tables), so they agree with stock to fp32 rounding (~2e-7 relative per call) and a dropped
feature (a cache that no longer skips, weights read without their casting hook) shows as a
difference of 1e-2 or more. After ``remove()`` the model must reproduce stock-with-feature
bit for bit.
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

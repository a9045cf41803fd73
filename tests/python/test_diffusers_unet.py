"""Stable Diffusion's UNet2DConditionModel under inject: its ResNet blocks (norm1 + SiLU, time
embedding + norm2 + SiLU, each one group_norm), the transformers' input GroupNorms, the output
norm + SiLU and the transformer blocks' LayerNorms against the stock model, on tiny SD 1.5- and
SDXL-shaped configs; bf16, channels last, hooks, layerwise casting and group offload, other
ResNet configurations staying stock, compile, training and remove()."""

import copy

import pytest
import torch

from conftest import rel_err

pytest.importorskip("diffusers")
from diffusers import UNet2DConditionModel  # noqa: E402

import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from ltx_kernels.integrations.diffusers import unet  # noqa: E402
from test_diffusers_flux import (  # noqa: E402
    assert_bf16_no_worse_than_stock,
    assert_composes_with_inject,
    assert_trains_like_stock,
    group_offload_block_level,
    inject_quietly,
    layerwise_casting_fp8,
)

GEGLU_KIND = "GEGLU (gelu_and_mul)"  # patched by class (ltx_kernels.diffusers)


def _tiny_unet(seed=0, **config):
    """fp32 tiny UNet (2 levels of 32 / 64 channels, 8 groups, 8x8 latents); the norms' weights
    and biases drawn away from 1 and 0 so that each affine, the time embedding's add and the
    order of norm and SiLU show in the output."""
    torch.manual_seed(seed)
    model = UNet2DConditionModel(sample_size=8, block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8,
                                 **config)
    for module in model.modules():
        if isinstance(module, (torch.nn.GroupNorm, torch.nn.LayerNorm)):
            module.weight.data.normal_(1.0, 0.3)
            module.bias.data.normal_(0.0, 0.3)
    return model.eval().requires_grad_(False)


def tiny_sd15(seed=0, **config):
    """SD 1.5's structure: conv projections around the transformers, 2 heads, text width 24."""
    return _tiny_unet(seed, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                      up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=2,
                      cross_attention_dim=24, **config)


def sd15_kwargs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(sample=torch.randn(2, 4, 8, 8, generator=g).to(dtype), timestep=torch.tensor([10, 500]),
                encoder_hidden_states=torch.randn(2, 7, 24, generator=g).to(dtype), return_dict=False)


def tiny_sdxl(seed=0):
    """SDXL's structure: no attention at the first level, linear projections, two transformer
    blocks per attention at the second, the pooled text and size / crop ids ("text_time")."""
    return _tiny_unet(seed, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                      up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
                      transformer_layers_per_block=(1, 2), use_linear_projection=True, cross_attention_dim=32,
                      addition_embed_type="text_time", addition_time_embed_dim=8,
                      projection_class_embeddings_input_dim=16 + 6 * 8)


def sdxl_kwargs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    time_ids = torch.tensor([[64.0, 64, 0, 0, 64, 64], [64, 48, 8, 0, 64, 64]])
    return dict(sample=torch.randn(2, 4, 8, 8, generator=g).to(dtype), timestep=torch.tensor([10, 500]),
                encoder_hidden_states=torch.randn(2, 7, 32, generator=g).to(dtype),
                added_cond_kwargs=dict(text_embeds=torch.randn(2, 16, generator=g).to(dtype),
                                       time_ids=time_ids.to(dtype)),
                return_dict=False)


MODELS = {"sd15": (tiny_sd15, sd15_kwargs), "sdxl": (tiny_sdxl, sdxl_kwargs)}
# Per model: 8 ResNet blocks (1 + 1 down, 2 mid, 2 + 2 up), 4 Transformer2DModels (1 down, 1
# mid, 2 up) with 1 BasicTransformerBlock each (SD 1.5) or 2 (SDXL: all at its second level), each
# block with 3 LayerNorms and a GEGLU, and the output norm + SiLU.
PATCHED = {
    "sd15": {unet.RESNET_KIND: 8, unet.TRANSFORMER_NORM_KIND: 4, unet.LAYER_NORM_KIND: 12, GEGLU_KIND: 4,
             unet.OUTPUT_KIND: 1},
    "sdxl": {unet.RESNET_KIND: 8, unet.TRANSFORMER_NORM_KIND: 4, unet.LAYER_NORM_KIND: 24, GEGLU_KIND: 8,
             unet.OUTPUT_KIND: 1},
}


@pytest.mark.parametrize("name", MODELS)
def test_matches_stock_and_reports_every_patch(name):
    make, kwargs = MODELS[name]
    stock = make()
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert dict(report.patched) == PATCHED[name] and not report.skipped, report
    with torch.no_grad():
        assert rel_err(model(**kwargs())[0], stock(**kwargs())[0]) < 1e-5
    assert not inject_quietly(model).patched  # a second inject patches nothing new


def group_norm_forms(monkeypatch, model, run) -> list:
    """The (with an add, activation) form of every group_norm call that ``run()`` makes after
    inject(model), sorted: counted through the ops module the integrations call."""
    from ltx_kernels import ops

    calls = []
    group_norm = ops.group_norm

    def counted(*args, add=None, activation=None, **kwargs):
        calls.append((add is not None, activation))
        return group_norm(*args, add=add, activation=activation, **kwargs)

    monkeypatch.setattr(ops, "group_norm", counted)
    inject_quietly(model)
    with torch.no_grad():
        run()
    return sorted(calls, key=str)


def test_the_fused_ops_run(monkeypatch):
    """The patched model reaches group_norm in its three forms: per ResNet block one with SiLU
    and one with the time embedding and SiLU, one plain per transformer, one with SiLU at the
    output."""
    model = tiny_sd15()
    forms = group_norm_forms(monkeypatch, model, lambda: model(**sd15_kwargs()))
    assert forms == sorted([(False, "silu")] * 9 + [(True, "silu")] * 8 + [(False, None)] * 4, key=str)


@pytest.mark.parametrize("name", MODELS)
def test_bf16_is_as_close_to_fp32_as_stock_bf16(name):
    make, kwargs = MODELS[name]
    reference = make()
    assert_bf16_no_worse_than_stock(reference, copy.deepcopy(reference).to(torch.bfloat16), kwargs)


@pytest.mark.parametrize("name", MODELS)
def test_channels_last(name):
    """A channels-last model and latent: the norms keep the layout, the output is stock's in
    values and memory format."""
    make, kwargs = MODELS[name]
    stock = make().to(memory_format=torch.channels_last)
    model = copy.deepcopy(stock)
    inject_quietly(model)
    inputs = kwargs()
    inputs["sample"] = inputs["sample"].to(memory_format=torch.channels_last)
    with torch.no_grad():
        ours, ref = model(**inputs)[0], stock(**inputs)[0]
    assert rel_err(ours, ref) < 1e-5
    assert ours.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("target", ["down_blocks.0.resnets.0.norm1", "down_blocks.0.resnets.0.norm2",
                                    "mid_block.resnets.1.nonlinearity", "down_blocks.0.attentions.0.norm",
                                    "up_blocks.1.attentions.0.transformer_blocks.0.norm3", "conv_norm_out",
                                    "conv_act"])
def test_hooks_on_fused_modules_see_their_call(target):
    """A forward hook that changes a fused module's output (a norm, a SiLU) sees that module's
    own call and changes the patched model's output as it changes stock's."""
    stock = tiny_sd15()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    seen = []
    for m in (stock, model):
        m.get_submodule(target).register_forward_hook(lambda module, args, output: seen.append(module) or output * 1.5)
    with torch.no_grad():
        assert rel_err(model(**sd15_kwargs())[0], stock(**sd15_kwargs())[0]) < 1e-5
    # (a ResNet block's SiLU runs three times: after norm1, on the time embedding, after norm2)
    assert len(seen) == 2 * (3 if target.endswith("nonlinearity") else 1)


@pytest.mark.parametrize("config, why", [(dict(resnet_time_scale_shift="scale_shift"), "'scale_shift'"),
                                         (dict(act_fn="mish"), "nonlinearity is Mish")])
def test_other_resnet_configurations_stay_stock_and_are_reported(config, why):
    stock = tiny_sd15(**config)
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[unet.RESNET_KIND] == 0 and report.patched[unet.TRANSFORMER_NORM_KIND] == 4, report
    resnets = [s for s in report.skipped if ".resnets." in s]
    assert len(resnets) == 8 and all(why in s and "stays stock" in s for s in resnets), report.skipped
    if "act_fn" in config:  # the output activation too
        assert report.patched[unet.OUTPUT_KIND] == 0
        assert any("GroupNorm + Mish" in s for s in report.skipped), report.skipped
    with torch.no_grad():
        assert rel_err(model(**sd15_kwargs())[0], stock(**sd15_kwargs())[0]) < 1e-5


def test_compile_fullgraph():
    """The patched model traces without a graph break (SDXL's config: every patched kind, and
    the model forward's added embeddings; compiling is most of this file's time)."""
    model = tiny_sdxl()
    inject_quietly(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert rel_err(compiled(**sdxl_kwargs())[0], model(**sdxl_kwargs())[0]) < 1e-6


@pytest.mark.parametrize("name", MODELS)
def test_remove_restores_stock_and_training_matches_stock(name):
    make, kwargs = MODELS[name]
    stock = make()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    assert lkd.remove(model) > 0 and not any(is_patched(m) for m in model.modules())
    assert not hasattr(model.conv_norm_out, "_ltx_kernels_owner")
    with torch.no_grad():
        assert torch.equal(model(**kwargs())[0], stock(**kwargs())[0])

    assert_trains_like_stock(stock, kwargs())


def test_a_norm_weight_the_op_does_not_take_runs_stock():
    """A GroupNorm whose weight is neither in the activations' dtype nor fp32 runs its own
    forward: on the CPU torch refuses that mix itself, so the patched model raises stock's
    error, not the op's."""
    stock = tiny_sd15()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    errors = []
    for m in (stock, model):
        m.down_blocks[0].resnets[0].norm2.to(torch.bfloat16)
        with pytest.raises(RuntimeError, match="mixed dtype") as error, torch.no_grad():
            m(**sd15_kwargs())
        errors.append(str(error.value))
    assert errors[0] == errors[1]


# Features a user turns on beside inject, in either order: they wrap the convolutions and
# linears that the fused forwards call as modules (layerwise casting skips norms by default).
COMPOSE = {
    "layerwise_casting_fp8": layerwise_casting_fp8,
    "group_offload_block_level": group_offload_block_level,
}


@pytest.mark.parametrize("order", ["feature_then_inject", "inject_then_feature"])
@pytest.mark.parametrize("feature", COMPOSE)
@torch.no_grad()
def test_features_compose_with_inject(feature, order):
    base = tiny_sd15()
    expected = assert_composes_with_inject(base, sd15_kwargs, COMPOSE[feature], order, unet.RESNET_KIND, 8)
    if feature == "layerwise_casting_fp8":  # the feature changes the output: it is active
        assert rel_err(expected, base(**sd15_kwargs())[0]) > 1e-3


def test_fp16_is_as_close_to_fp32_as_stock_fp16():
    """An fp16 model (T4-class GPUs have no bf16; SD 1.5 is often run so): no further from the
    fp32 model than stock fp16 (fp16 convolutions run on the CPU in this torch)."""
    reference = tiny_sd15()
    stock16 = copy.deepcopy(reference).half()
    ours16 = copy.deepcopy(stock16)
    inject_quietly(ours16)
    with torch.no_grad():
        ref = reference(**sd15_kwargs())[0]
        err_stock = rel_err(stock16(**sd15_kwargs(torch.float16))[0], ref)
        err_ours = rel_err(ours16(**sd15_kwargs(torch.float16))[0], ref)
    assert err_ours <= 1.1 * err_stock, (err_ours, err_stock)


def test_inject_on_meta_then_load_weights_runs_as_on_a_real_model():
    """inject() on a UNet built on the meta device (init_empty_weights, as from_pretrained
    does), weights loaded afterwards: the same output as a real model injected, bit for bit."""
    real = tiny_sdxl()
    with torch.device("meta"):
        empty = UNet2DConditionModel(**real.config)
    assert inject_quietly(empty).patched
    empty = empty.to_empty(device="cpu")
    empty.load_state_dict(real.state_dict())
    inject_quietly(real)
    with torch.no_grad():
        assert torch.equal(empty(**sdxl_kwargs())[0], real(**sdxl_kwargs())[0])


def test_fp8_quantizes_the_transformer_linears_not_the_time_embeddings():
    """precision="fp8" (emulated on the CPU): the transformers' linears in FP8, the per-sample
    time and added-condition embeddings and the ResNet blocks' time-embedding projections (one
    row per sample) in the model's dtype (_fp8.DEFAULT_FP8_SKIP); the output within the
    format's error."""
    from ltx_kernels._fp8 import is_quantized
    from test_diffusers_flux import assert_fp8_within_format_error

    stock = tiny_sdxl()
    assert_fp8_within_format_error(stock, sdxl_kwargs())
    model = copy.deepcopy(stock)
    inject_quietly(model, precision="fp8")
    quantized = {name for name, m in model.named_modules() if is_quantized(m)}
    assert "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q" in quantized
    assert "down_blocks.1.attentions.0.proj_in" in quantized  # (a full-size GEMM: every token)
    assert not any(part in name for name in quantized
                   for part in ("time_embedding.", "add_embedding.", "time_emb_proj")), sorted(quantized)

"""The image VAE (diffusers' ``AutoencoderKL``: SD, SDXL, SD3, FLUX) under inject: its encoder's
and decoder's ResNet blocks (norm1 + SiLU, norm2 + SiLU, each one group_norm), the mid-block
attention's GroupNorm and the output norms + SiLU against the stock model on a tiny config;
bf16, channels last, hooks, compile, training and remove()."""

import copy

import pytest
import torch

from conftest import rel_err

pytest.importorskip("diffusers")
from diffusers import AutoencoderKL  # noqa: E402

import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from ltx_kernels.integrations.diffusers import unet  # noqa: E402
from test_diffusers_flux import assert_trains_like_stock, inject_quietly  # noqa: E402
from test_diffusers_unet import group_norm_forms  # noqa: E402

# Encoder: 2 down blocks of 1 ResNet block, mid block 2; decoder: 2 up blocks of 2, mid 2.
PATCHED = {unet.RESNET_KIND: 10, unet.ATTENTION_NORM_KIND: 2, unet.OUTPUT_KIND: 2}


def tiny_vae(seed=0):
    """fp32 tiny AutoencoderKL (32 / 64 channels, 8 groups); the norms' weights and biases drawn
    away from 1 and 0 so that each affine and the order of norm and SiLU show in the output."""
    torch.manual_seed(seed)
    model = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                          block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8, latent_channels=4,
                          sample_size=16)
    for module in model.modules():
        if isinstance(module, torch.nn.GroupNorm):
            module.weight.data.normal_(1.0, 0.3)
            module.bias.data.normal_(0.0, 0.3)
    return model.eval().requires_grad_(False)


def image(dtype=torch.float32, seed=0):
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed)).to(dtype)


def roundtrip(model, x):
    """Encode (the posterior's mode) and decode."""
    return model.decode(model.encode(x).latent_dist.mode()).sample


def test_matches_stock_and_reports_every_patch():
    stock = tiny_vae()
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert dict(report.patched) == PATCHED and not report.skipped, report
    with torch.no_grad():
        assert rel_err(roundtrip(model, image()), roundtrip(stock, image())) < 1e-5
    assert not inject_quietly(model).patched  # a second inject patches nothing new


def test_the_fused_ops_run(monkeypatch):
    """Every ResNet norm and both output norms run group_norm with the SiLU, the attention
    norms without."""
    model = tiny_vae()
    forms = group_norm_forms(monkeypatch, model, lambda: roundtrip(model, image()))
    assert forms == sorted([(False, "silu")] * 22 + [(False, None)] * 2, key=str)


def test_bf16_is_as_close_to_fp32_as_stock_bf16():
    reference = tiny_vae()
    stock16 = copy.deepcopy(reference).to(torch.bfloat16)
    ours16 = copy.deepcopy(stock16)
    inject_quietly(ours16)
    with torch.no_grad():
        ref = roundtrip(reference, image())
        err_stock = rel_err(roundtrip(stock16, image(torch.bfloat16)), ref)
        err_ours = rel_err(roundtrip(ours16, image(torch.bfloat16)), ref)
    assert err_ours <= 1.1 * err_stock, (err_ours, err_stock)


def test_channels_last():
    stock = tiny_vae().to(memory_format=torch.channels_last)
    model = copy.deepcopy(stock)
    inject_quietly(model)
    x = image().to(memory_format=torch.channels_last)
    with torch.no_grad():
        ours, ref = roundtrip(model, x), roundtrip(stock, x)
    assert rel_err(ours, ref) < 1e-5
    assert ours.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("target", ["decoder.up_blocks.0.resnets.0.norm2", "decoder.mid_block.attentions.0.group_norm",
                                    "decoder.conv_norm_out", "decoder.conv_act"])
def test_hooks_on_fused_modules_see_their_call(target):
    """A forward hook that changes a fused module's output: the patched model gives stock's
    result with the same hook."""
    stock = tiny_vae()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    for m in (stock, model):
        m.get_submodule(target).register_forward_hook(lambda mod, args, out: out * 0.5 + 0.25)
    with torch.no_grad():
        assert rel_err(roundtrip(model, image()), roundtrip(stock, image())) < 1e-5


def test_compile_fullgraph():
    model = tiny_vae()
    inject_quietly(model)
    latent = torch.randn(2, 4, 4, 4)
    torch._dynamo.reset()
    compiled = torch.compile(lambda z: model.decode(z).sample, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert rel_err(compiled(latent), model.decode(latent).sample) < 1e-6


def test_remove_restores_stock_and_training_matches_stock():
    stock = tiny_vae()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    assert lkd.remove(model) > 0 and not any(is_patched(m) for m in model.modules())
    assert not hasattr(model.decoder.conv_norm_out, "_ltx_kernels_owner")
    with torch.no_grad():
        assert torch.equal(roundtrip(model, image()), roundtrip(stock, image()))

    assert_trains_like_stock(stock, dict(sample=image()))


def test_fp8_leaves_the_vae_in_its_dtype():
    """precision="fp8" patches the VAE's norms but quantizes none of its linears (its mid-block
    attention's: _fp8.DEFAULT_FP8_SKIP), so its output is the bf16 patch's."""
    from ltx_kernels._fp8 import is_quantized

    stock = tiny_vae()
    model = copy.deepcopy(stock)
    report = inject_quietly(model, precision="fp8")
    assert dict(report.patched) == PATCHED, report
    assert not any(is_quantized(m) for m in model.modules())
    with torch.no_grad():
        assert rel_err(roundtrip(model, image()), roundtrip(stock, image())) < 1e-5


def test_sdxl_pipeline_with_its_vae_gives_the_stock_image():
    """inject(pipe) on an SDXL pipeline (tiny UNet and VAE, synthetic text embeddings): both
    models are patched, and the decoded image is stock's."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from test_diffusers_unet import tiny_sdxl

    def pipeline():
        return StableDiffusionXLPipeline(vae=tiny_vae(), text_encoder=None, text_encoder_2=None, tokenizer=None,
                                         tokenizer_2=None, unet=tiny_sdxl(), scheduler=EulerDiscreteScheduler())

    g = torch.Generator().manual_seed(5)
    text = dict(prompt_embeds=torch.randn(1, 7, 32, generator=g), negative_prompt_embeds=torch.randn(1, 7, 32, generator=g),
                pooled_prompt_embeds=torch.randn(1, 16, generator=g),
                negative_pooled_prompt_embeds=torch.randn(1, 16, generator=g))
    images = []
    for kernels in (False, True):
        pipe = pipeline()
        if kernels:
            report = inject_quietly(pipe)
            assert report.patched[unet.RESNET_KIND] == 8 + 10 and report.patched[unet.OUTPUT_KIND] == 1 + 2, report
        images.append(pipe(**text, height=16, width=16, num_inference_steps=2, output_type="pt",
                           generator=torch.Generator().manual_seed(0)).images)
    assert images[0].shape == (1, 3, 16, 16)
    assert rel_err(images[1], images[0]) < 1e-4

"""Wan 2.1 / 2.2 under inject (issue 20): the fused WanTransformerBlocks and the self-attention
RoPE processor against the stock model (text-to-video, Wan 2.2 TI2V's per-token modulation,
image-to-video's added K/V, no cross-attention norm, fused projections), in fp32 and bf16
(also with diffusers' fp32-kept modules), with hooks, a custom processor, an unsupported block,
compile, training, FP8 and remove()."""

import copy

import pytest
import torch

from conftest import DEVICES, rel_err

pytest.importorskip("diffusers")
from diffusers import WanTransformer3DModel  # noqa: E402
from diffusers.utils import logging as diffusers_logging  # noqa: E402

import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels.integrations.diffusers import wan  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from test_diffusers_flux import (  # noqa: E402
    assert_bf16_no_worse_than_stock,
    assert_fp8_within_format_error,
    assert_hooked_call_runs,
    assert_trains_like_stock,
    inject_quietly,
)

# Latent [B, C, F, H, W] = [2, 4, 3, 8, 10]: 3 x 4 x 5 = 60 tokens after the (1, 2, 2) patches.
TOKENS = 60
IMAGE_TOKENS = 5


def tiny_wan(variant="t2v", seed=0, device="cpu"):
    """fp32 tiny Wan transformer (2 blocks, D = 48, head_dim 24: RoPE sections 8/8/8). The
    modulation tables, the time projection and the norms' weights are randomized so that
    modulation, gates and norm2's affine matter (defaults make some near-trivial).

    variants: ``t2v`` (Wan 2.1 T2V), ``i2v`` (image embedder and attn2's added K/V),
    ``no_cross_norm`` (norm2 is Identity), ``fused`` (fuse_qkv_projections)."""
    torch.manual_seed(seed)
    config = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24, in_channels=4,
                  out_channels=4, text_dim=16, freq_dim=32, ffn_dim=96, num_layers=2, rope_max_seq_len=32)
    if variant == "i2v":
        config.update(image_dim=8, added_kv_proj_dim=48)
    if variant == "no_cross_norm":
        config.update(cross_attn_norm=False)
    model = WanTransformer3DModel(**config).eval()
    for name, p in model.named_parameters():
        if "scale_shift_table" in name or "time_proj" in name:
            p.data.normal_(0.0, 0.3)
        elif "norm" in name:
            p.data.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)
    if variant == "fused":
        model.fuse_qkv_projections()
    return model.requires_grad_(False).to(device)


def wan_kwargs(variant="t2v", dtype=torch.float32, device="cpu", seed=0):
    """Inputs for ``tiny_wan(variant)``; ``ti2v``: Wan 2.2's per-token timesteps ([B, S]),
    ``i2v``: an image embedding and the 512 text tokens its stock processor assumes."""
    g = torch.Generator().manual_seed(seed)
    timestep = torch.rand(2, TOKENS, generator=g) * 1000 if variant == "ti2v" else torch.tensor([100.0, 700.0])
    text = 512 if variant == "i2v" else 7
    kwargs = dict(hidden_states=torch.randn(2, 4, 3, 8, 10, generator=g).to(dtype), timestep=timestep,
                  encoder_hidden_states=torch.randn(2, text, 16, generator=g).to(dtype), return_dict=False)
    if variant == "i2v":
        kwargs["encoder_hidden_states_image"] = torch.randn(2, IMAGE_TOKENS, 8, generator=g).to(dtype)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def model_variant(variant):
    return "t2v" if variant == "ti2v" else variant


def to_bf16(model, keep_fp32):
    """The model in bf16; ``keep_fp32``: as ``from_pretrained(torch_dtype=bf16)`` leaves it, with
    diffusers' ``_keep_in_fp32_modules`` (modulation tables, norms, rope, time embedder) in fp32."""
    level = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # .to() warns about those modules
    try:
        model = copy.deepcopy(model).to(torch.bfloat16)
    finally:
        diffusers_logging.set_verbosity(level)
    if keep_fp32:
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in model._keep_in_fp32_modules:
                module.float()
        for name, p in model.named_parameters():
            if name.endswith("scale_shift_table"):
                p.data = p.data.float()
    return model


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["t2v", "ti2v", "i2v", "no_cross_norm", "fused"])
def test_blocks_match_stock_fp32(variant, device):
    stock = tiny_wan(model_variant(variant), device=device)
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[wan.BLOCK_KIND] == 2, report
    assert report.patched[wan.ATTN_KIND] == 2, report  # attn1 of each block (attn2 has no RoPE)
    assert report.patched["torch.nn.RMSNorm (rms_norm)"] >= 8  # the QK norms, by class
    assert report.patched["GELU tanh (linear_gelu_tanh)"] == 2  # the feed-forwards, by class
    with torch.no_grad():
        out = model(**wan_kwargs(variant, device=device))[0]
        ref = stock(**wan_kwargs(variant, device=device))[0]
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["t2v", "ti2v"])
@pytest.mark.parametrize("keep_fp32", [False, True])
def test_bf16_is_as_close_to_fp32_as_stock_bf16(variant, keep_fp32, device):
    """Our bf16 model's error against stock fp32 is no worse than stock bf16's. Stock keeps the
    modulation in fp32; the ops read it rounded to bf16 (measured on 4 seeds: 0.95x to 1.05x
    stock's error; the norms, residuals and RoPE round once where stock rounds more)."""
    reference = tiny_wan(model_variant(variant), device=device)
    report = assert_bf16_no_worse_than_stock(reference, to_bf16(reference, keep_fp32),
                                             lambda dtype: wan_kwargs(variant, dtype, device))
    assert report.patched[wan.BLOCK_KIND] == 2


@pytest.mark.parametrize("target", ["blocks.0.norm1", "blocks.0.norm2", "blocks.1.norm3", "blocks.0.ffn",
                                    "blocks.0.ffn.net.0.proj", "blocks.1.attn1", "blocks.0.attn1.norm_q",
                                    "blocks.0.attn2", "blocks.1.attn1.to_out.0", "blocks.0.attn1.to_v"])
def test_hooks_on_fused_submodules_run(target):
    """A hook on a norm a fused forward reads in place sees its call (that part runs unfused),
    and the output stays stock's."""
    assert_hooked_call_runs(tiny_wan(), target, wan_kwargs())


def test_remove_restores_stock():
    stock = tiny_wan()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    assert lkd.remove(model) > 0
    assert not any(is_patched(m) for m in model.modules())
    assert all(type(b.attn1.processor).__name__ == "WanAttnProcessor" for b in model.blocks)
    with torch.no_grad():
        assert torch.equal(model(**wan_kwargs())[0], stock(**wan_kwargs())[0])


def test_unsupported_block_stays_stock_and_is_reported():
    """A block whose norm2 is not the FP32LayerNorm the fused forward reproduces (here a plain
    nn.LayerNorm, which computes in the activations' dtype) stays stock, reported."""
    stock = tiny_wan()
    stock.blocks[1].norm2 = torch.nn.LayerNorm(48, eps=1e-6)
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[wan.BLOCK_KIND] == 1 and not is_patched(model.blocks[1])
    assert any("blocks.1 stays stock" in s and "norm2" in s for s in report.skipped), report.skipped
    with torch.no_grad():
        assert rel_err(model(**wan_kwargs())[0], stock(**wan_kwargs())[0]) < 1e-5


def test_custom_processor_stays_and_backend_reaches_ours():
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    class Custom(WanAttnProcessor):
        pass

    model = tiny_wan()
    model.blocks[0].attn1.set_processor(Custom())
    report = inject_quietly(model)
    assert report.patched[wan.ATTN_KIND] == 1 and report.patched[wan.BLOCK_KIND] == 2
    assert any("Custom" in s for s in report.skipped), report.skipped
    model.set_attention_backend("native")
    ours = model.blocks[1].attn1.processor
    assert isinstance(ours, wan.WanKernelsAttnProcessor)
    assert ours._attention_backend is not None and ours._stock._attention_backend is ours._attention_backend


def test_processor_without_wan_tables_runs_stock_steps():
    """Our attn1 processor given no RoPE, or tables not shaped as WanRotaryPosEmbed's
    [1, S, 1, head_dim], runs the stock processor's steps (the same output, up to the QK norms,
    patched by class)."""
    stock = tiny_wan()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    x = torch.randn(2, TOKENS, 48)
    cos, sin = stock.rope(torch.zeros(2, 4, 3, 8, 10))
    with torch.no_grad():
        for rotary_emb in (None, (cos[0], sin[0]), (cos, sin)):  # no RoPE, [S, 1, D], ours
            assert rel_err(model.blocks[0].attn1(x, None, None, rotary_emb),
                           stock.blocks[0].attn1(x, None, None, rotary_emb)) < 1e-6


@pytest.mark.parametrize("variant", ["t2v", "ti2v"])
def test_compile_fullgraph(variant):
    model = tiny_wan()
    inject_quietly(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert rel_err(compiled(**wan_kwargs(variant))[0], model(**wan_kwargs(variant))[0]) < 1e-6


def test_trains_like_stock():
    """In train mode every patched module has a backward; gradients match stock's."""
    assert_trains_like_stock(tiny_wan(), wan_kwargs())


def test_fp8_runs_within_the_format_error():
    """Also that the default fp8_skip keeps the condition embedder (whose forward casts the
    timestep to its time embedder's weight dtype) out of FP8."""
    report = assert_fp8_within_format_error(tiny_wan(), wan_kwargs())
    assert report.patched[wan.BLOCK_KIND] == 2


def test_fp8_norms_write_quantized_inputs_and_gemms_write_residuals(monkeypatch):
    """Under FP8, per block: norm1 writes its output quantized for the self-attention's q/k/v,
    which share it, as norm3 does for the FFN; the self-attention's output projection and the
    FFN's down projection GEMMs write the gated residuals (no gated_residual pass). 6
    quantizations a block: norm1's, attn1's output's, the cross-attention's query and output
    (its text k/v stay in the model's dtype: inject's default fp8_skip), norm3's and the GELU
    hidden's. The output is the fusions-off copy's."""
    from test_fp8 import fp8_fused_run

    model = tiny_wan()
    inject_quietly(model, precision="fp8")
    got, unfused, calls, fused, passes = fp8_fused_run(model, wan_kwargs(), monkeypatch,
                                                       ("attn1", "norm1", "norm3", "ffn"))
    assert len(fused) == 2 * 2 and not passes
    assert calls.count("adaln_layer_norm_fp8") == 2 * 2 and len(calls) == 2 * 6, calls
    assert rel_err(got, unfused) < 1e-5  # fp32: the GEMM-written residual rounds as the pass does


def test_benchmark_inputs_run_on_the_tiny_config():
    """The Wan benchmark's model and inputs (its GPU run uses the 14B config), on the CPU at the
    tiny one, stock and injected: the fp32 modules diffusers keeps are fp32, the token count is
    the patched latents'."""
    from ltx_kernels.bench import wan_e2e

    model = wan_e2e.random_transformer("wan-tiny", torch.bfloat16, "cpu")
    assert model.blocks[0].scale_shift_table.dtype == torch.float32
    assert model.condition_embedder.time_embedder.linear_1.weight.dtype == torch.float32
    assert model.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16
    frames, height, width = wan_e2e.CONFIGS["wan-tiny"][1]
    kw = wan_e2e.step_inputs(model, frames, height, width, 7, "cpu")
    assert kw["hidden_states"].shape == (1, 4, 3, 8, 10)
    assert wan_e2e.tokens("wan-tiny", frames, height, width) == 3 * 4 * 5
    assert wan_e2e.tokens("wan21-14b", *wan_e2e.CONFIGS["wan21-14b"][1]) == 21 * 30 * 52
    with torch.no_grad():
        ref = model(**kw)[0]
        report = inject_quietly(model)
        assert report.patched[wan.BLOCK_KIND] == 2, report
        assert ref.shape == kw["hidden_states"].shape and rel_err(model(**kw)[0], ref) < 2e-2


def test_benchmark_full_config_is_wan21_14b():
    """The benchmark's full config has Wan 2.1 14B's parameter count (14.29 B), built on Meta."""
    from ltx_kernels.bench import wan_e2e

    model = wan_e2e.random_transformer("wan21-14b", torch.bfloat16, "meta")
    assert 14.2e9 < sum(p.numel() for p in model.parameters()) < 14.4e9

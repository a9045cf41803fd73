"""Stable Diffusion 3 / 3.5 under inject (issue 20): the fused joint blocks (and the AdaLN-Zero
norms by class) against the stock model: SD3 and SD3.5's dual attention, the last block's
context_pre_only, bf16, hooks, feed-forward chunking, compile, training and remove()."""

import copy

import pytest
import torch

from conftest import rel_err

pytest.importorskip("diffusers")
from diffusers import SD3Transformer2DModel  # noqa: E402

import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels.integrations.diffusers import sd3  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from test_diffusers_flux import (  # noqa: E402
    assert_bf16_no_worse_than_stock,
    assert_composes_with_inject,
    assert_hooked_call_runs,
    assert_fp8_within_format_error,
    assert_trains_like_stock,
    group_offload_block_level,
    inject_quietly,
    layerwise_casting_fp8,
)


def tiny_sd3(dual=False, seed=0):
    """fp32 tiny SD3 transformer (2 joint blocks, the last context_pre_only); ``dual``: SD3.5's
    second attention in block 0. AdaLN linears scaled up so that the modulation matters."""
    torch.manual_seed(seed)
    model = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16,
                                  num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32,
                                  pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16, qk_norm="rms_norm",
                                  dual_attention_layers=(0,) if dual else ()).eval()
    for name, p in model.named_parameters():
        if "norm" in name and "linear" in name:
            p.data.normal_(0.0, 0.3)
    return model.requires_grad_(False)


def sd3_kwargs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(2, 4, 8, 8, generator=g).to(dtype),
                encoder_hidden_states=torch.randn(2, 5, 24, generator=g).to(dtype),
                pooled_projections=torch.randn(2, 16, generator=g).to(dtype),
                timestep=torch.tensor([10.0, 500.0]), return_dict=False)


@pytest.mark.parametrize("dual", [False, True])
def test_joint_blocks_match_stock(dual):
    stock = tiny_sd3(dual)
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[sd3.BLOCK_KIND] == 2, report
    with torch.no_grad():
        assert rel_err(model(**sd3_kwargs())[0], stock(**sd3_kwargs())[0]) < 1e-5


def test_bf16_is_as_close_to_fp32_as_stock_bf16():
    reference = tiny_sd3(dual=True)
    assert_bf16_no_worse_than_stock(reference, copy.deepcopy(reference).to(torch.bfloat16), sd3_kwargs)


@pytest.mark.parametrize("target", ["transformer_blocks.0.norm2", "transformer_blocks.0.norm2_context",
                                    "transformer_blocks.1.norm2", "transformer_blocks.0.ff",
                                    "transformer_blocks.0.attn2"])
def test_hooks_on_fused_submodules_run(target):
    assert_hooked_call_runs(tiny_sd3(dual=True), target, sd3_kwargs())


def test_feed_forward_chunking_stays_stock_and_is_reported():
    model = tiny_sd3()
    model.enable_forward_chunking(chunk_size=3)
    report = inject_quietly(model)
    assert report.patched[sd3.BLOCK_KIND] == 0
    assert any("chunking" in s for s in report.skipped), report.skipped


def test_fp8_norms_write_quantized_inputs_and_gemms_write_residuals(monkeypatch):
    """inject(precision="fp8"): within the format's error of fp32. Each AdaLN-Zero norm writes
    its output quantized for the FP8 linears after it (norm1 and norm1_context for each
    stream's q/k/v, norm2 and norm2_context for the feed-forwards: 4 in the first block, 2 in
    the last, whose text is context_pre_only), and every gated residual is written by the GEMM
    before it (the output projections and the feed-forward down projections: 4 + 2), with no
    gated_residual pass; the output is what the same model computes with those fusions off (a
    hook on each fused module)."""
    from test_fp8 import fp8_fused_run

    model = tiny_sd3()
    assert_fp8_within_format_error(model, sd3_kwargs())
    inject_quietly(model, precision="fp8")
    got, unfused, calls, fused, passes = fp8_fused_run(
        model, sd3_kwargs(), monkeypatch, ("attn", "norm1", "norm1_context", "norm2", "norm2_context", "ff", "ff_context"))
    assert len(fused) == 4 + 2 and not passes
    assert calls.count("adaln_layer_norm_fp8") == 4 + 2, calls
    # one quantization per FP8 linear's input, q/k/v sharing one: the 4 embedder linears; per
    # block each AdaLN modulation linear, each norm's output, each output projection's input and
    # each FF's GELU hidden; the last block's text q/k/v one of its continuous norm's output
    assert len(calls) == 4 + (2 + 2 + 2 + 2 + 2) + (2 + 1 + 1 + 1 + 1 + 1), calls
    assert rel_err(got, unfused) < 1e-2  # the same FP8 roundings but the residuals' (rounded once)


def test_remove_compile_and_training():
    stock = tiny_sd3(dual=True)
    model = copy.deepcopy(stock)
    inject_quietly(model)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        assert rel_err(compiled(**sd3_kwargs())[0], model(**sd3_kwargs())[0]) < 1e-6
    assert lkd.remove(model) > 0 and not any(is_patched(m) for m in model.modules())

    assert_trains_like_stock(stock, sd3_kwargs())


@pytest.mark.parametrize("dual", [False, True])
def test_joint_attention_processor_matches_stock_and_reaches_our_backend(dual):
    """Every joint attention (and SD3.5's second attention) takes our processor; the output is
    stock's; inject(attention="bf16") then runs our attention op through diffusers' dispatcher
    (stock's processor calls SDPA directly, so no backend reached it), within its rounding."""
    stock = tiny_sd3(dual)
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[sd3.ATTN_KIND] == 2 + dual, report
    assert all(type(b.attn.processor) is sd3.SD3KernelsJointAttnProcessor for b in model.transformer_blocks)
    with torch.no_grad():
        ref = stock(**sd3_kwargs())[0]
        assert rel_err(model(**sd3_kwargs())[0], ref) < 1e-5
        backend = copy.deepcopy(stock)
        inject_quietly(backend, attention="bf16")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = backend(**sd3_kwargs())[0]
        assert any(e.key == "ltx_kernels::attention" for e in prof.key_averages())
        assert rel_err(out, ref) < 1e-2


def test_fused_qkv_attention_stays_stock_and_is_reported():
    """fuse_qkv_projections gives the attention diffusers' FusedJointAttnProcessor2_0: not ours."""
    stock = tiny_sd3()
    stock.fuse_qkv_projections()
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[sd3.ATTN_KIND] == 0 and report.patched[sd3.BLOCK_KIND] == 2, report
    assert any("FusedJointAttnProcessor2_0" in s for s in report.skipped), report.skipped
    with torch.no_grad():
        assert rel_err(model(**sd3_kwargs())[0], stock(**sd3_kwargs())[0]) < 1e-5


def _lora(model):
    from peft import LoraConfig

    torch.manual_seed(1)  # the same random adapter weights for the stock and the injected model
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                                 target_modules=["to_q", "to_k", "to_v", "add_q_proj", "to_out.0"]))


# Features a user turns on beside inject, in either order, through our joint-attention processor.
COMPOSE = {
    "layerwise_casting_fp8": layerwise_casting_fp8,
    "group_offload_block_level": group_offload_block_level,
    "forward_hooks_on_qk_norms": lambda model: [
        block.attn.get_submodule(name).register_forward_hook(lambda module, args, output: output * 1.5)
        for block in model.transformer_blocks for name in ("norm_q", "norm_added_k")],
    "lora": _lora,
}


@pytest.mark.parametrize("order", ["feature_then_inject", "inject_then_feature"])
@pytest.mark.parametrize("feature", COMPOSE)
@torch.no_grad()
def test_features_compose_with_inject(feature, order):
    base = tiny_sd3(dual=True)
    plain = base(**sd3_kwargs())[0]
    expected = assert_composes_with_inject(base, sd3_kwargs, COMPOSE[feature], order, sd3.ATTN_KIND, 3)
    if feature != "group_offload_block_level":  # the feature changes the output: it is active
        assert rel_err(expected, plain) > 1e-2, "the feature does nothing here: the test would prove nothing"


@torch.no_grad()
def test_user_processor_and_backend_after_inject():
    """set_attn_processor after inject replaces ours (stock output again); set_attention_backend
    after inject reaches ours and the stock processor beneath it."""
    from diffusers.models.attention_processor import JointAttnProcessor2_0

    stock = tiny_sd3()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    model.set_attention_backend("native")
    ours = model.transformer_blocks[0].attn.processor
    assert isinstance(ours, sd3.SD3KernelsJointAttnProcessor)
    assert ours._attention_backend is not None and ours._stock._attention_backend is ours._attention_backend
    model.set_attn_processor(JointAttnProcessor2_0())
    assert type(model.transformer_blocks[0].attn.processor) is JointAttnProcessor2_0
    assert rel_err(model(**sd3_kwargs())[0], stock(**sd3_kwargs())[0]) < 1e-5

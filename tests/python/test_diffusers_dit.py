"""PixArt and DiT under inject (issue 20): their BasicTransformerBlocks (AdaLN-single with the
block's scale-shift table, AdaLN-Zero with its norm3) fused against the stock model, with
cross-attention and its key mask (PixArt) and class labels (DiT); bf16, hooks, chunking, other
norm types staying stock, compile, training, FP8 and remove()."""

import copy

import pytest
import torch

from conftest import rel_err

pytest.importorskip("diffusers")
from diffusers import DiTTransformer2DModel, PixArtTransformer2DModel  # noqa: E402

import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from ltx_kernels.integrations.diffusers import dit, flux, sd3  # noqa: E402
from test_diffusers_flux import (  # noqa: E402
    assert_bf16_no_worse_than_stock,
    assert_composes_with_inject,
    assert_fp8_within_format_error,
    assert_hooked_call_runs,
    assert_trains_like_stock,
    group_offload_block_level,
    inject_quietly,
    layerwise_casting_fp8,
)


def _scaled(model):
    """Modulation tables and AdaLN linears scaled up so that the modulation matters."""
    for name, p in model.named_parameters():
        if "scale_shift_table" in name or ("norm1" in name and "linear" in name) or "adaln_single.linear" in name:
            p.data.normal_(0.0, 0.3)
    return model.eval().requires_grad_(False)


def tiny_pixart(seed=0):
    """fp32 tiny PixArt-Σ-shaped transformer: 2 blocks, cross-attention to 7 caption tokens."""
    torch.manual_seed(seed)
    return _scaled(PixArtTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8, num_layers=2,
        cross_attention_dim=32, sample_size=8, patch_size=2, caption_channels=24, norm_num_groups=1,
        use_additional_conditions=False))


def pixart_kwargs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(2, 7)
    mask[1, 4:] = 0  # the second caption is padded
    return dict(hidden_states=torch.randn(2, 4, 8, 8, generator=g).to(dtype),
                encoder_hidden_states=torch.randn(2, 7, 24, generator=g).to(dtype),
                encoder_attention_mask=mask, timestep=torch.tensor([10, 500]), return_dict=False)


def tiny_dit(seed=0):
    """fp32 tiny DiT (class-conditional, 2 blocks)."""
    torch.manual_seed(seed)
    return _scaled(DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, num_layers=2,
                                         sample_size=8, patch_size=2, norm_num_groups=1, num_embeds_ada_norm=10))


def dit_kwargs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(2, 4, 8, 8, generator=g).to(dtype), timestep=torch.tensor([10, 500]),
                class_labels=torch.tensor([3, 7]), return_dict=False)


MODELS = {"pixart": (tiny_pixart, pixart_kwargs), "dit": (tiny_dit, dit_kwargs)}


@pytest.mark.parametrize("name", MODELS)
def test_blocks_match_stock(name):
    make, kwargs = MODELS[name]
    stock = make()
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[dit.BLOCK_KIND] == 2, report
    assert all(is_patched(block) for block in model.transformer_blocks)
    if name == "dit":  # its norm1 is an AdaLayerNormZero, patched by class
        assert report.patched[flux.ADALN_KIND] == 2, report
    # each block's attentions take our processor (DiT's blocks have no cross-attention)
    assert report.patched[dit.ATTN_KIND] == (4 if name == "pixart" else 2), report
    with torch.no_grad():
        assert rel_err(model(**kwargs())[0], stock(**kwargs())[0]) < 1e-5


def test_the_fused_ops_run(monkeypatch):
    """The patched blocks reach adaln_layer_norm (two per block) and have the output and down
    projections write the gated residuals (linear_gated_residual, two per block: no
    gated_residual pass), not the stock arithmetic: counted through the ops module the
    integrations call."""
    from ltx_kernels import ops

    calls = {"adaln_layer_norm": 0, "gated_residual": 0, "linear_gated_residual": 0}
    for op in calls:
        original = getattr(ops, op)

        def counted(*args, _op=op, _original=original, **kwargs):
            calls[_op] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(ops, op, counted)
    model = tiny_pixart()
    inject_quietly(model)
    with torch.no_grad():
        model(**pixart_kwargs())
    assert calls == {"adaln_layer_norm": 4, "gated_residual": 0, "linear_gated_residual": 4}, calls


@pytest.mark.parametrize("name", MODELS)
def test_bf16_is_as_close_to_fp32_as_stock_bf16(name):
    make, kwargs = MODELS[name]
    reference = make()
    assert_bf16_no_worse_than_stock(reference, copy.deepcopy(reference).to(torch.bfloat16), kwargs)


@pytest.mark.parametrize("target", ["transformer_blocks.0.norm1", "transformer_blocks.0.norm2",
                                    "transformer_blocks.1.ff", "transformer_blocks.0.attn2",
                                    "transformer_blocks.1.attn1", "transformer_blocks.0.attn1.to_k"])
def test_hooks_on_pixart_submodules_run(target):
    assert_hooked_call_runs(tiny_pixart(), target, pixart_kwargs())


def test_hooks_on_dit_submodules_run():
    assert_hooked_call_runs(tiny_dit(), "transformer_blocks.1.norm3", dit_kwargs())


def test_feed_forward_chunking_stays_stock_and_is_reported():
    model = tiny_pixart()
    model.transformer_blocks[1].set_chunk_feed_forward(4, dim=1)
    report = inject_quietly(model)
    assert report.patched[dit.BLOCK_KIND] == 1
    assert any("chunking" in s for s in report.skipped), report.skipped
    with torch.no_grad():
        assert rel_err(model(**pixart_kwargs())[0], tiny_pixart()(**pixart_kwargs())[0]) < 1e-5


def test_affine_norms_stay_stock_and_are_reported():
    stock = tiny_pixart()
    stock.transformer_blocks[0].norm2 = torch.nn.LayerNorm(32, eps=1e-6)
    torch.nn.init.normal_(stock.transformer_blocks[0].norm2.weight)
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[dit.BLOCK_KIND] == 1
    assert any("norm2 is not a LayerNorm without affine" in s for s in report.skipped), report.skipped
    with torch.no_grad():
        assert rel_err(model(**pixart_kwargs())[0], stock(**pixart_kwargs())[0]) < 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_remove_compile_and_training(name):
    make, kwargs = MODELS[name]
    stock = make()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        assert rel_err(compiled(**kwargs())[0], model(**kwargs())[0]) < 1e-6
    assert lkd.remove(model) > 0 and not any(is_patched(m) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(**kwargs())[0], stock(**kwargs())[0])

    assert_trains_like_stock(stock, kwargs())


def test_fp8_linears_under_the_fused_blocks():
    report = assert_fp8_within_format_error(tiny_pixart(), pixart_kwargs())
    assert report.patched[dit.BLOCK_KIND] == 2, report


@pytest.mark.parametrize("name", MODELS)
def test_fp8_norms_write_quantized_inputs_and_gemms_write_residuals(name, monkeypatch):
    """inject(precision="fp8"): norm1 writes its output quantized for attn1's q/k/v, which share
    it, as the FF's norm does for the FF; the cross-attention's k/v share one quantization of
    the caption; attn1's output projection and the FF's down projection GEMMs write the gated
    residuals (no gated_residual pass). Per PixArt block 6 quantizations: norm1's, attn1's
    output's, attn2's query and caption, the FF's norm and GELU hidden; per DiT block 4 (no
    cross-attention) beside the 3 linears of its AdaLN-Zero norm (the timestep embedding's two,
    the modulation), and the output AdaLN's timestep embedding (2). The output is the
    fusions-off copy's."""
    from test_fp8 import fp8_fused_run

    make, kwargs = MODELS[name]
    model = make()
    inject_quietly(model, precision="fp8")
    got, unfused, calls, fused, passes = fp8_fused_run(model, kwargs(), monkeypatch,
                                                       ("attn1", "norm1", "norm2", "norm3", "ff"))
    assert len(fused) == 2 * 2 and not passes
    assert calls.count("adaln_layer_norm_fp8") == 2 * 2, calls
    assert len(calls) == (2 * 6 if name == "pixart" else 2 * (4 + 3) + 2), calls
    assert rel_err(got, unfused) < 1e-5  # fp32: the GEMM-written residual rounds as the pass does


def test_fp8_attention_projections_of_one_input_are_one_gemm(monkeypatch):
    """PixArt under FP8: attn1's q/k/v are one GEMM over adjacent FP8 weights, the cross-
    attention's caption k/v one GEMM over adjacent weights kept in the model's dtype; the
    output equals, bitwise, the one with every linear stored apart (one GEMM each)."""
    from test_fp8 import block_gemms, stored_apart

    model = tiny_pixart()
    inject_quietly(model, precision="fp8")
    apart = copy.deepcopy(model)
    stored_apart(apart)
    with torch.no_grad():
        with monkeypatch.context() as patched:
            grouped = block_gemms(patched, model)
            out = model(**pixart_kwargs())[0]
        separate = block_gemms(monkeypatch, apart)
        ref = apart(**pixart_kwargs())[0]
    D = model.transformer_blocks[0].attn1.to_q.out_features
    blocks = range(len(model.transformer_blocks))
    assert all((f"{i}.attn1.to_q", 3 * D) in grouped and (f"{i}.attn2.to_k", 2 * D) in grouped for i in blocks)
    assert not any(name.endswith(("to_v", "attn1.to_k")) for name, _ in grouped), grouped
    assert all({(f"{i}.attn1.to_k", D), (f"{i}.attn2.to_v", D)} <= set(separate) for i in blocks)
    assert len(grouped) == len(separate) - 3 * len(blocks)
    assert torch.equal(out, ref)


def test_fp8_keeps_dit_output_projections_in_the_model_dtype():
    """DiT's output is proj_out_1 (its final AdaLN table) and proj_out_2: outside the blocks,
    they stay in the model's dtype by default, as every model's output projection."""
    model = tiny_dit()
    report = inject_quietly(model, precision="fp8")
    assert type(model.proj_out_1) is torch.nn.Linear and type(model.proj_out_2) is torch.nn.Linear
    assert model.proj_out_1.weight.dtype == torch.float32 and model.proj_out_2.weight.dtype == torch.float32
    assert is_patched(model.transformer_blocks[0].attn1.to_q), report


@pytest.mark.parametrize("config, kind, channels", [("pixart-tiny", dit.BLOCK_KIND, 8), ("dit-tiny", dit.BLOCK_KIND, 8),
                                                   ("sd3-tiny", sd3.BLOCK_KIND, 4)])
def test_benchmark_inputs_run_on_the_tiny_configs(config, kind, channels):
    """The image DiT benchmark's models and inputs (its GPU run uses the full-size configs), on
    the CPU at the tiny ones, stock and injected."""
    from ltx_kernels.bench import dit_e2e

    model = dit_e2e.random_transformer(config, torch.float32, "cpu")
    kw = dit_e2e.step_inputs(model, config, 64, "cpu")
    with torch.no_grad():
        ref = model(**kw)[0]
        report = inject_quietly(model)
        assert report.patched[kind] == 2, report
        assert ref.shape == (2, channels, 8, 8) and rel_err(model(**kw)[0], ref) < 1e-5


@pytest.mark.parametrize("mode", ["compile", "ours+compile"])
def test_benchmark_compiles_the_blocks_of_models_that_declare_none(mode):
    """PixArt and DiT declare no repeated blocks for diffusers' compile_repeated_blocks: the
    benchmark's compile modes compile each BasicTransformerBlock (lazily: nothing runs here)."""
    from ltx_kernels.bench.ltx_e2e import set_mode

    model = tiny_pixart()
    assert not getattr(model, "_repeated_blocks", None)
    set_mode(model, mode)
    assert all(block._compiled_call_impl is not None for block in model.transformer_blocks)
    assert all(is_patched(block) == mode.startswith("ours") for block in model.transformer_blocks)
    set_mode(model, "eager")
    assert all(block._compiled_call_impl is None and not is_patched(block) for block in model.transformer_blocks)


# Features a user turns on beside inject, in either order (the LTX matrix is test_diffusers_compose.py;
# diffusers' cache hooks need CacheMixin, which PixArt does not have).
COMPOSE = {
    "layerwise_casting_fp8": layerwise_casting_fp8,
    "group_offload_block_level": group_offload_block_level,
    "forward_hooks_on_fused_norms": lambda model: [
        block.get_submodule(name).register_forward_hook(lambda module, args, output: output * 1.5)
        for block in model.transformer_blocks for name in ("norm1", "norm2")],
}


@pytest.mark.parametrize("order", ["feature_then_inject", "inject_then_feature"])
@pytest.mark.parametrize("feature", COMPOSE)
@torch.no_grad()
def test_pixart_features_compose_with_inject(feature, order):
    base = tiny_pixart()
    plain = base(**pixart_kwargs())[0]
    expected = assert_composes_with_inject(base, pixart_kwargs, COMPOSE[feature], order, dit.BLOCK_KIND, 2)
    if feature != "group_offload_block_level":  # the feature changes the output: it is active
        assert rel_err(expected, plain) > 1e-2, "the feature does nothing here: the test would prove nothing"

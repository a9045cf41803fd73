"""LTX-2 (diffusers' LTX2VideoTransformer3DModel, video + audio) under inject (issue 20): its
family module (integrations/diffusers/ltx2.py: blocks on adaln_rms_norm / gated_residual, the
interleaved-RoPE processors on rms_norm / ltx_rope), the by-class patches (RMSNorms, GELU-tanh
feed-forwards) and our attention backend, against the stock model: fp32 within rounding, bf16
no worse than stock, training, remove(), fullgraph compile; LTX-2.3's gated attention and
cross-attention modulation; split RoPE and perturbed attention reported and left stock; what a
user turns on beside inject (layerwise casting, group offload, hooks, a LoRA adapter) in
either order."""

import copy

import pytest
import torch

from conftest import DEVICES, rel_err

pytest.importorskip("diffusers")
from diffusers import LTX2VideoTransformer3DModel  # noqa: E402
from diffusers.models.normalization import RMSNorm  # noqa: E402

import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels.integrations.diffusers import ltx2  # noqa: E402
from test_diffusers_flux import (  # noqa: E402
    assert_composes_with_inject,
    assert_trains_like_stock,
    group_offload_block_level,
    inject_quietly,
    layerwise_casting_fp8,
)

LAYERS = 2
B, FRAMES, HEIGHT, WIDTH, AUDIO_FRAMES, TEXT = 2, 2, 4, 4, 5, 7


def tiny_ltx2(seed=0, **config):
    """fp32 tiny LTX-2 transformer (2 blocks, video and audio: 2 heads of 8), its weights
    randomized so that every norm, gate and modulation matters."""
    torch.manual_seed(seed)
    model = LTX2VideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=8,
        audio_cross_attention_dim=16, num_layers=LAYERS, caption_channels=16, norm_elementwise_affine=True,
        **config,
    ).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def inputs(dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    return dict(hidden_states=n(B, FRAMES * HEIGHT * WIDTH, 8), audio_hidden_states=n(B, AUDIO_FRAMES, 8),
                encoder_hidden_states=n(B, TEXT, 16), audio_encoder_hidden_states=n(B, TEXT, 16),
                timestep=torch.tensor([500.0, 300.0], dtype=dtype), num_frames=FRAMES, height=HEIGHT, width=WIDTH,
                audio_num_frames=AUDIO_FRAMES)  # fmt: skip


def outputs(model, dtype=torch.float32):
    with torch.no_grad():
        out = model(**inputs(dtype))
    return out.sample.float(), out.audio_sample.float()


@pytest.mark.parametrize("attention", [None, "bf16"])
def test_matches_stock_fp32(attention):
    stock = tiny_ltx2()
    model = copy.deepcopy(stock)
    report = inject_quietly(model, attention=attention)
    norms = [m for m in model.modules() if type(m) is RMSNorm]
    torch_norms = [m for m in model.modules() if type(m) is torch.nn.RMSNorm]  # q/k across heads
    assert report.patched["RMSNorm (rms_norm)"] == len(norms) > 0
    assert report.patched["torch.nn.RMSNorm (rms_norm)"] == len(torch_norms) > 0
    assert report.patched["GELU tanh (linear_gelu_tanh)"] == 2 * LAYERS  # video and audio FF
    assert report.patched[ltx2.BLOCK_KIND] == LAYERS
    # per block: self, text cross and audio-video attention of each stream
    assert report.patched[ltx2.ATTN_KIND] == 6 * LAYERS
    assert all(type(m.processor) is ltx2.LTX2KernelsAttnProcessor for m in model.modules() if hasattr(m, "processor"))
    if attention is not None:
        assert report.patched["LTX2Attention (attention backend 'ltx_kernels')"] == 6 * LAYERS
    for ours, ref in zip(outputs(model), outputs(stock)):
        assert rel_err(ours, ref) < 1e-5


# LTX-2.3's options: per-head attention gates, the cross-attention queries modulated and gated,
# the text keys modulated by the prompt's timestep embedding (or its static table without it).
LTX23 = dict(gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True)


@pytest.mark.parametrize("config", [LTX23, dict(LTX23, use_prompt_adaln_single=False),
                                    dict(cross_attn_mod=True)], ids=["ltx2.3", "static-prompt-table", "video-mod"])
def test_ltx23_options_match_stock_fp32(config):
    stock = tiny_ltx2(**config)
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[ltx2.BLOCK_KIND] == LAYERS and report.patched[ltx2.ATTN_KIND] == 6 * LAYERS
    kw = dict(inputs(), sigma=torch.tensor([0.5, 0.3]), return_dict=False)
    with torch.no_grad():
        for ours, ref in zip(model(**kw), stock(**kw)):
            assert rel_err(ours.float(), ref.float()) < 1e-5


@pytest.mark.parametrize("config, reason", [(dict(rope_type="split"), "its RoPE is 'split'"),
                                            (dict(perturbed_attn=True), "perturbed attention")])
def test_unsupported_forms_reported_and_stock(config, reason):
    stock = tiny_ltx2(**config)
    model = copy.deepcopy(stock)
    with pytest.warns(UserWarning, match=reason):
        report = lkd.inject(model)
    assert any(reason in why for why in report.skipped)
    if "rope_type" in config:
        assert report.patched[ltx2.BLOCK_KIND] == LAYERS and ltx2.ATTN_KIND not in report.patched
    else:
        assert ltx2.BLOCK_KIND not in report.patched and ltx2.ATTN_KIND not in report.patched
    for ours, ref in zip(outputs(model), outputs(stock)):
        assert rel_err(ours, ref) < 1e-5


def test_bf16_no_worse_than_stock():
    reference = tiny_ltx2()
    stock16 = copy.deepcopy(reference).to(torch.bfloat16)
    ours16 = copy.deepcopy(stock16)
    inject_quietly(ours16)
    for ours, stock, ref in zip(outputs(ours16, torch.bfloat16), outputs(stock16, torch.bfloat16), outputs(reference)):
        assert 0 < rel_err(ours, ref) <= 1.1 * rel_err(stock, ref)


def test_trains_like_stock():
    assert_trains_like_stock(tiny_ltx2(), inputs())


def test_remove_restores_stock():
    stock = tiny_ltx2()
    model = copy.deepcopy(stock)
    report = inject_quietly(model, attention="bf16")
    assert lkd.remove(model) == sum(report.patched.values())
    for ours, ref in zip(outputs(model), outputs(stock)):
        assert torch.equal(ours, ref)


def test_compile_fullgraph():
    """Patched, with our attention backend: one graph (no break) and the eager outputs."""
    model = tiny_ltx2()
    inject_quietly(model, attention="bf16")
    eager = outputs(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for ours, ref in zip(outputs(compiled), eager):
        assert rel_err(ours, ref) < 1e-6


def benchmark_tiny():
    """The LTX-2 benchmark's model and step inputs at its tiny config (fp32, CPU)."""
    from ltx_kernels.bench import ltx2_e2e

    model = ltx2_e2e.random_transformer("ltx2-tiny", torch.float32, "cpu")
    frames, height, width, fps = ltx2_e2e.CONFIGS["ltx2-tiny"][1]
    return model, ltx2_e2e.step_inputs(model, frames, height, width, fps, 7, "cpu")


def fp64_video_rope_tables(rope, coords):
    """diffusers' interleaved video RoPE formula in fp64, ``(cos, sin)`` ``[B, S, dim]``: angle =
    freq * (2 * position / base - 1) at the patches' midpoints (``coords`` ``[B, 3, S, 2]``),
    pairs interleaved, the dim % 6 leading channels passed through."""
    mid = ((coords[..., 0] + coords[..., 1]) / 2.0).double().transpose(1, 2)  # [B, S, 3]
    bases = torch.tensor([rope.base_num_frames, rope.base_height, rope.base_width], dtype=torch.float64)
    freqs = rope.theta ** torch.linspace(0, 1, rope.dim // 6, dtype=torch.float64) * torch.pi / 2
    angle = ((2 * (mid / bases).unsqueeze(-1) - 1) * freqs).transpose(-1, -2).flatten(2).repeat_interleave(2, -1)
    pad = (*angle.shape[:-1], rope.dim % 6)
    return (torch.cat([torch.ones(pad, dtype=torch.float64), angle.cos()], -1),
            torch.cat([torch.zeros(pad, dtype=torch.float64), angle.sin()], -1))


def fp64_exact_rope_output(model, kw):
    """``model``'s video output in fp64 with the video RoPE's tables formed in fp64
    (:func:`fp64_video_rope_tables`): the reference of the in-kernel angles (stock forms the
    tables in fp32 even in an fp64 model)."""
    reference = copy.deepcopy(model).double()
    rope = reference.rope
    rope.forward = lambda coords, device=None: fp64_video_rope_tables(rope, coords)
    with torch.no_grad():
        return reference(**{k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                            for k, v in kw.items()})[0]


def test_benchmark_inputs_run_on_the_tiny_config():
    """The LTX-2 benchmark's model and inputs (its GPU run uses the 19 B config), on the CPU at
    the tiny one, stock and injected (with diffusers' RoPE tables: within fp32 rounding)."""
    from ltx_kernels.bench import ltx2_e2e

    model, kw = benchmark_tiny()
    frames, height, width, fps = ltx2_e2e.CONFIGS["ltx2-tiny"][1]
    f, h, w, audio = ltx2_e2e.latent_shape(model, frames, height, width, fps)
    assert (f, h, w) == (2, 2, 3) and kw["hidden_states"].shape == (2, 12, 8)
    assert kw["audio_hidden_states"].shape == (2, audio, 8) and audio == round(9 / 24 * 25)
    with torch.no_grad():
        ref = model(**kw)[0]
        report = inject_quietly(model, rope="stock")
        assert report.patched["GELU tanh (linear_gelu_tanh)"] == 2 * LAYERS, report
        assert ref.shape == (2, 12, 8) and rel_err(model(**kw)[0], ref) < 1e-5


class QKNormRopeSpy:
    """Counts ltx_qk_norm_rope calls (monkeypatched over ops')."""

    def __init__(self, monkeypatch):
        from ltx_kernels import ops

        self.calls, real = 0, ops.ltx_qk_norm_rope

        def spy(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(ops, "ltx_qk_norm_rope", spy)


@pytest.mark.parametrize("device", DEVICES)
def test_video_self_attention_computes_its_rope_from_positions(device, monkeypatch):
    """Under inject's default rope="exact" each block's video self-attention runs its q/k norms
    and RoPE as one ltx_qk_norm_rope from the patches' midpoints: an fp32 model then agrees with
    the fp64 formula to fp32 rounding, >10x closer than stock's fp32 tables (measured on the CPU
    1.9e-7 against 1.0e-5 at the benchmark's tiny config)."""
    stock, kw = benchmark_tiny()
    reference = fp64_exact_rope_output(stock, kw)
    stock = stock.to(device)
    kw = {k: v.to(device) if torch.is_tensor(v) else v for k, v in kw.items()}
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert report.patched[ltx2.ROPE_KIND] == 1
    spy = QKNormRopeSpy(monkeypatch)
    with torch.no_grad():
        ours, plain = model(**kw)[0].cpu(), stock(**kw)[0]
    assert spy.calls == LAYERS  # the audio and cross-modal RoPEs (one axis) keep their tables
    assert rel_err(ours, reference) < 1e-6
    assert 10 * rel_err(ours, reference) < rel_err(plain.cpu(), reference)
    assert lkd.remove(model) > 0
    with torch.no_grad():
        assert torch.equal(model(**kw)[0], plain)


@pytest.mark.parametrize("how", ["rope_stock", "processors_set_after_inject", "group_offload"])
def test_tables_where_positions_cannot_go(how, monkeypatch):
    """inject(rope="stock"), a stock processor set after inject (it receives the tables with
    their positions, a tuple of them) and group offloading (its device transfer rebuilds the
    tuple without them) all run diffusers' tables: stock's output within fp32 rounding."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoAttnProcessor

    stock, kw = benchmark_tiny()
    with torch.no_grad():
        plain = stock(**kw)[0]
    model = copy.deepcopy(stock)
    if how == "group_offload":
        group_offload_block_level(model)
    report = inject_quietly(model, rope="stock" if how == "rope_stock" else "exact")
    assert (ltx2.ROPE_KIND in report.patched) == (how != "rope_stock")
    if how == "processors_set_after_inject":
        model.set_attn_processor(LTX2AudioVideoAttnProcessor())
    spy = QKNormRopeSpy(monkeypatch)
    with torch.no_grad():
        assert rel_err(model(**kw)[0], plain) < 1e-5
    assert spy.calls == 0


def test_benchmark_full_config_is_ltx2_19b():
    """The benchmark's full config: LTX-2's 18.9 B parameters (Meta) and LTX2Pipeline's default
    video (121 frames of 768x512 at 24 fps: 16 x 16 x 24 latents, 126 audio latents)."""
    from ltx_kernels.bench import ltx2_e2e

    model = ltx2_e2e.random_transformer("ltx2-19b", torch.bfloat16, "meta")
    assert 18.8e9 < sum(p.numel() for p in model.parameters()) < 19.0e9
    assert ltx2_e2e.latent_shape(model, *ltx2_e2e.CONFIGS["ltx2-19b"][1]) == (16, 16, 24, 126)


def _lora(model):
    from peft import LoraConfig

    torch.manual_seed(1)  # the same random adapter weights for the stock and the injected model
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                                 target_modules=["to_q", "to_k", "to_v", "to_out.0"]))


# Features a user turns on beside inject, in either order. (diffusers 0.42.1's block caches do
# not run on LTX-2: FirstBlockCache has no entry for its block, TaylorSeer needs a pipeline's
# cache context.)
COMPOSE = {
    "layerwise_casting_fp8": layerwise_casting_fp8,
    "group_offload_block_level": group_offload_block_level,
    "forward_hooks_on_qk_norms": lambda model: [
        block.get_submodule(attn).get_submodule(norm).register_forward_hook(lambda module, args, output: output * 4.0)
        for block in model.transformer_blocks for attn in ("attn1", "audio_attn1") for norm in ("norm_q", "norm_k")],
    "lora": _lora,
}


@pytest.mark.parametrize("order", ["feature_then_inject", "inject_then_feature"])
@pytest.mark.parametrize("feature", COMPOSE)
@torch.no_grad()
def test_features_compose_with_inject(feature, order):
    base = tiny_ltx2()
    plain = base(**inputs())[0]
    expected = assert_composes_with_inject(base, inputs, COMPOSE[feature], order, ltx2.ATTN_KIND, 6 * LAYERS)
    # The feature changes the output 100x more than the 1e-5 that ours may differ from stock by
    # (the tiny model's attention branches move its output by little: the hooks give 2e-3).
    if feature != "group_offload_block_level":
        assert rel_err(expected, plain) > 1e-3, "the feature does nothing here: the test would prove nothing"


# FP8 (e4m3) against the fp32 model, video and audio output: measured 2.8e-2 / 6.1e-2 (the audio
# stream's 16-channel dot products average less of the rounding), the same with each linear
# quantizing its own input.
FP8_TOLERANCE = (5e-2, 8e-2)


def test_fp8_norms_write_quantized_inputs_and_gemms_write_gated_residuals(monkeypatch):
    """inject(precision="fp8"): per block and stream, the self-attention's, the feed-forward's
    and both sides' of each audio-video attention modulated norms write their outputs quantized
    for the FP8 projections (adaln_rms_norm_fp8: 8 a block), the feed-forward's GELU is computed
    in its up projection's GEMM, and the output projections of every attention (self,
    text, audio-to-video, video-to-audio) and the feed-forward's down projection write the
    residuals, gated or not (fp8_linear_gated_residual: 8 a block, no gated_residual pass); the
    output stays FP8's distance from fp32."""
    from test_fp8 import count_quantizations

    from ltx_kernels import _fp8

    stock = tiny_ltx2()
    reference = outputs(stock)
    model = copy.deepcopy(stock)
    inject_quietly(model, precision="fp8")
    gelus = []
    calls = count_quantizations(monkeypatch, gelus)
    fused = []
    gemm = _fp8.ops.fp8_linear_gated_residual

    def counting(*args):
        fused.append(args)
        return gemm(*args)

    monkeypatch.setattr(_fp8.ops, "fp8_linear_gated_residual", counting)
    passes = []
    monkeypatch.setattr(ltx2.ops, "gated_residual", lambda *args: passes.append(args) or args[0])
    got = outputs(model)
    assert calls.count("adaln_rms_norm_fp8") == 8 * LAYERS, calls
    assert calls.count("gelu_tanh") == 0 and gelus == ["gelu_tanh"] * 2 * LAYERS  # in the up projections' GEMMs
    assert len(fused) == 8 * LAYERS and not passes
    for ours, ref, bound in zip(got, reference, FP8_TOLERANCE):
        assert 0 < rel_err(ours, ref) <= bound


@pytest.mark.parametrize("target", ["norm1", "attn1", "attn1.to_q", "attn1.to_out.0", "audio_to_video_norm",
                                    "norm3", "ff", "ff.net.0.proj", "ff.net.2", "attn2", "attn2.to_out.0",
                                    "audio_to_video_attn.to_out.0", "video_to_audio_attn"])
def test_fp8_hooks_on_producers_and_consumers_of_a_quantized_norm_output_run(target):
    """A forward hook on a norm that would write FP8, or on a module that would read it or write
    the gated residual, sees its call under precision="fp8" (that part runs unfused), and the
    output stays FP8's distance from fp32."""
    stock = tiny_ltx2()
    reference = outputs(stock)
    model = copy.deepcopy(stock)
    inject_quietly(model, precision="fp8")
    seen = []
    model.transformer_blocks[0].get_submodule(target).register_forward_hook(lambda m, i, o: seen.append(m))
    for ours, ref, bound in zip(outputs(model), reference, FP8_TOLERANCE):
        assert 0 < rel_err(ours, ref) <= bound
    assert seen


@pytest.mark.parametrize("dim, grid, fps", [(64, (2, 4, 4), 24.0), (256, (3, 5, 7), 25.0), (126, (4, 6, 8), 24.0)])
def test_video_rope_is_ltx_rope_angles_on_patch_midpoints(dim, grid, fps):
    """LTX-2's video RoPE (interleaved) is LTX-Video's, with the positions the patches'
    midpoints (frames divided by fps) over the rotary module's bases: ltx_rope_angles on those
    coordinates matches the fp64 formula ~100x closer than diffusers' fp32 tables applied with
    ltx_rope do: what the video self-attention's q/k kernel computes its angles from (the
    model-level test: test_video_self_attention_computes_its_rope_from_positions)."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    from ltx_kernels import ops

    rope = LTX2AudioVideoRotaryPosEmbed(dim=dim, modality="video", rope_type="interleaved", num_attention_heads=2)
    frames, height, width = grid
    coords = rope.prepare_video_coords(2, frames, height, width, torch.device("cpu"), fps=fps)  # [B, 3, S, 2]
    cos, sin = rope(coords)
    x = torch.randn(2, frames * height * width, dim)
    mid = coords.mean(-1)  # [B, 3, S]
    angles = ops.ltx_rope_angles(x, None, None, None, video_coords=mid, theta=rope.theta,
                                 base_num_frames=rope.base_num_frames, base_height=rope.base_height,
                                 base_width=rope.base_width)
    cos64, sin64 = fp64_video_rope_tables(rope, coords)
    pairs = x.double().unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
    reference = x.double() * cos64 + rotated * sin64
    assert rel_err(angles, reference) < 1e-5
    assert rel_err(ops.ltx_rope(x, cos, sin), reference) > 10 * rel_err(angles, reference)

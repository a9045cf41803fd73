"""ltx_kernels.diffusers.inject on LTX-Video: patched vs stock diffusers, at model level.

The bar (DESIGN.md section 4): the patched bf16 model's output, against the stock model run in
fp32, is no worse than the stock bf16 model's (x1.1 slack); for one transformer step with
each way the pipelines pass positions and timesteps, and after a 10-step CFG denoising loop
with the pipeline's scheduler. Tiny random models here (CPU and, where present, CUDA); the
full-size 2B check runs on the GPU (test_full_size_2b).
"""

import copy
import warnings

import pytest
import torch

from conftest import DEVICES, HAS_CUDA, rel_err

pytest.importorskip("diffusers")
import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels.bench import ltx_models  # noqa: E402

SLACK = 1.1


def tiny_model(device, head_dim=10, seed=0, affine=False):
    """fp32 tiny LTX transformer; head_dim 10 gives D = 40 (D % 6 = 4 identity channels),
    12 gives D = 48; ``affine`` gives norm1/norm2 weights. Weights are scaled up from the
    default init so that the blocks (adaLN tables, norms' weights) are not near-identity."""
    cfg = dict(ltx_models.CONFIGS["tiny"], attention_head_dim=head_dim, cross_attention_dim=4 * head_dim,
               norm_elementwise_affine=affine)
    torch.manual_seed(seed)
    from diffusers import LTXVideoTransformer3DModel

    model = LTXVideoTransformer3DModel(**cfg).to(device).eval().requires_grad_(False)
    for name, p in model.named_parameters():
        if "norm" in name or "scale_shift_table" in name:
            p.normal_(1.0 if "norm" in name else 0.0, 0.5)
    return model


def bf16_copy(model):
    return torch.nn.Module.to(copy.deepcopy(model), torch.bfloat16)


def step_kwargs(model, positions, per_token, batch=2, grid=(3, 4, 5), tokens=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    f, h, w = grid
    s = f * h * w

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    mask = torch.ones(batch, tokens, device=device)
    mask[0, tokens // 2:] = 0
    timestep = (torch.rand(batch, s, generator=g) if per_token else torch.rand(batch, generator=g)) * 1000
    kw = dict(
        hidden_states=randn(batch, s, model.config.in_channels),
        encoder_hidden_states=randn(batch, tokens, model.config.caption_channels),
        timestep=timestep.to(device),
        encoder_attention_mask=mask,
        num_frames=f, height=h, width=w,
        return_dict=False,
    )
    if positions == "interpolation_scale":
        kw["rope_interpolation_scale"] = (8 / 25, 32.0, 32.0)
    elif positions == "video_coords":
        coords = torch.stack(torch.meshgrid(*(torch.arange(n) for n in grid), indexing="ij")).flatten(1)
        coords = coords.float() * torch.tensor([[8 / 25], [32.0], [32.0]]) + torch.rand(3, s, generator=g)
        kw["video_coords"] = coords.expand(batch, 3, s).to(device)
        kw.update(num_frames=None, height=None, width=None)
    return kw


def as_dtype(kw, dtype):
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() and k.endswith("states") else v
            for k, v in kw.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim,affine", [(10, False), (12, False), (12, True)])
@pytest.mark.parametrize("positions", ["interpolation_scale", "raw_grid", "video_coords"])
@pytest.mark.parametrize("per_token", [False, True])
@torch.no_grad()
def test_one_step_no_worse_than_stock_bf16(device, head_dim, affine, positions, per_token):
    reference = tiny_model(device, head_dim, affine=affine)
    kw = step_kwargs(reference, positions, per_token)
    expected = reference(**kw)[0]
    stock = bf16_copy(reference)
    stock_err = rel_err(stock(**as_dtype(kw, torch.bfloat16))[0], expected)

    report = lkd.inject(stock)
    assert report.patched["LTXVideoTransformerBlock (adaln_rms_norm, linear_gated_residual or gated_residual, "
                          "gated_residual_adaln_rms_norm)"] == 2
    assert not report.skipped
    ours_err = rel_err(stock(**as_dtype(kw, torch.bfloat16))[0], expected)
    assert ours_err <= SLACK * stock_err, (ours_err, stock_err)

    # fp32 patched equals fp32 stock up to fp32 rounding and diffusers' fp32 RoPE tables.
    lkd.inject(reference)
    assert rel_err(reference(**kw)[0], expected) < 2e-3


@pytest.mark.parametrize("device", DEVICES)
@torch.no_grad()
def test_denoising_loop_no_worse_than_stock_bf16(device):
    """10 CFG steps of LTXPipeline (scheduler included) from the same noise."""
    reference = tiny_model(device)
    stock = bf16_copy(reference)

    def latents(transformer):
        pipe = ltx_models.random_pipeline(transformer)
        pipe.set_progress_bar_config(disable=True)
        embeds = ltx_models.prompt_embeds(transformer, batch=1)
        g = torch.Generator(device=device).manual_seed(0)
        return pipe(**embeds, num_frames=17, height=96, width=128, num_inference_steps=10,
                    guidance_scale=3.0, output_type="latent", generator=g).frames

    expected = latents(reference)
    stock_err = rel_err(latents(stock), expected)
    lkd.inject(stock)
    ours_err = rel_err(latents(stock), expected)
    assert ours_err <= SLACK * stock_err, (ours_err, stock_err)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_token", [False, True])
@torch.no_grad()
def test_gemms_write_the_gated_residuals(monkeypatch, device, per_token):
    """Per block, x + gate * attn1's output, x + attn2's (no gate) and x + gate * the FF's are
    written by the output and down projections' GEMMs (linear_gated_residual), not by separate
    gated_residual passes (nor attn2's residual by norm2); with per-token timesteps (a gate row
    per token) the gated two are not. The model stays as close to the fp32 stock model as the
    unfused ops (fp32 on the CPU; bf16 on CUDA, where the kernel needs D a multiple of 8)."""
    from ltx_kernels import _fp8

    stock = tiny_model(device, head_dim=12)
    kw = step_kwargs(stock, "interpolation_scale", per_token=per_token)
    expected = stock(**kw)[0]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = torch.nn.Module.to(copy.deepcopy(stock), dtype)
    stock_err = rel_err(model(**as_dtype(kw, dtype))[0], expected)
    lkd.inject(model)
    calls = []
    for name in ("linear_gated_residual", "gated_residual", "gated_residual_adaln_rms_norm"):
        def counting(*args, _op=getattr(_fp8.ops, name), _name=name):
            calls.append(_name)
            return _op(*args)

        monkeypatch.setattr(_fp8.ops, name, counting)
    out = model(**as_dtype(kw, dtype))[0]
    gated = "gated_residual" if per_token else "linear_gated_residual"
    assert calls == [gated, "linear_gated_residual", gated] * len(model.transformer_blocks)
    # (fp32: our in-kernel RoPE angles against diffusers' fp32 tables alone differ by ~1e-5)
    assert rel_err(out, expected) <= (SLACK * stock_err if dtype == torch.bfloat16 else 2e-5)


@pytest.mark.parametrize("target", ["attn1", "attn1.to_out.0", "attn2", "attn2.to_out.0", "ff", "ff.net.2"])
@torch.no_grad()
def test_hooked_projections_keep_the_module_call(target):
    """A hook on an attention, its output projection, the feed-forward or its down projection
    sees its call: that residual is then the module's output added by gated_residual (or norm2,
    for attn2), with the same result."""
    model = tiny_model("cpu", head_dim=12)
    lkd.inject(model)
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    fused = model(**kw)[0]
    seen = []
    model.transformer_blocks[0].get_submodule(target).register_forward_hook(lambda m, i, o: seen.append(m))
    assert rel_err(model(**kw)[0], fused) < 1e-6 and seen


@pytest.mark.parametrize("device", DEVICES)
@torch.no_grad()
def test_remove_restores_stock(device):
    model = tiny_model(device)
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    expected = model(**kw)[0]
    with lkd.injected(model) as report:
        assert sum(report.patched.values()) == 9
        assert lkd.inject(model).patched == {}  # idempotent
        assert not torch.equal(model(**kw)[0], expected)
    assert not any("forward" in m.__dict__ or "_ltx_kernels_patch" in m.__dict__ for m in model.modules())
    assert type(model.transformer_blocks[0].attn1.processor).__name__ == "LTXVideoAttnProcessor"
    assert torch.equal(model(**kw)[0], expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["offload_then_inject", "inject_then_offload"])
@pytest.mark.parametrize("affine", [False, True])
@torch.no_grad()
def test_sequential_offload_hooks(device, order, affine):
    """accelerate's per-module hooks (what enable_sequential_cpu_offload installs): weights
    live on the meta device until the module's hook loads them, including the norm_q/norm_k
    weights that the fused attention reads without calling the norms."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.hooks import remove_hook_from_module

    model = tiny_model("cpu", affine=affine)
    kw = step_kwargs(model.to(device), "interpolation_scale", per_token=False)
    lkd.inject(model)
    expected = model(**kw)[0]
    lkd.remove(model)
    model.to("cpu")
    if order == "inject_then_offload":
        lkd.inject(model)
    accelerate.cpu_offload(model, execution_device=torch.device(device))
    assert model.transformer_blocks[0].attn1.norm_q.weight.device.type == "meta"
    if order == "offload_then_inject":
        lkd.inject(model)
    torch.testing.assert_close(model(**kw)[0], expected)
    assert lkd.remove(model) == 9
    remove_hook_from_module(model, recurse=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("how", ["model", "repeated_blocks"])
@torch.no_grad()
def test_torch_compile_fullgraph(device, how):
    """No graph breaks: fullgraph=True raises on any. Inductor on CUDA; on the CPU the
    aot_eager backend (the same Dynamo/AOT tracing, without building C++ kernels)."""
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    model = tiny_model(device)
    lkd.inject(model)
    kw = step_kwargs(model, "interpolation_scale", per_token=True)
    coords = step_kwargs(model, "video_coords", per_token=False)
    expected, expected_coords = model(**kw)[0], model(**coords)[0]
    if how == "model":
        run = torch.compile(model, fullgraph=True, backend=backend)
    else:
        model.compile_repeated_blocks(fullgraph=True, backend=backend)
        run = model
    torch.testing.assert_close(run(**kw)[0], expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(run(**coords)[0], expected_coords, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@torch.no_grad()
def test_compiled_block_computes_its_modulation_in_one_kernel(precision):
    """Inductor (C++ kernels on the CPU, Triton on CUDA: the same lowering) realizes the
    block's AdaLN modulation sum once, its six slices views of it. Without the block forward's
    as_strided, it recomputed each slice our kernels read in a kernel of its own: 4 kernels a
    block where eager runs one add (on the H100, launches that made ours+compile slower than
    ours at 49 frames)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    torch.manual_seed(0)
    from diffusers import LTXVideoTransformer3DModel

    # Features that are multiples of 16, so that precision="fp8" quantizes the block linears.
    model = LTXVideoTransformer3DModel(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=16,
                                       cross_attention_dim=32, num_layers=2, caption_channels=32).eval()
    lkd.inject(model, precision=precision)
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    expected = model(**kw)[0]
    model.compile_repeated_blocks(fullgraph=True)
    out, codes = run_and_get_code(lambda: model(**kw)[0])
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    (block_code,) = codes  # one graph, shared by both blocks
    assert block_code.count("async_compile.cpp_pybinding(") == 1, block_code


@torch.no_grad()
def test_unpatchable_block_warns_and_model_stays_correct():
    from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor

    class CustomProcessor(LTXVideoAttnProcessor):
        pass

    model = tiny_model("cpu")
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    expected = model(**kw)[0]
    model.transformer_blocks[1].attn1.set_processor(CustomProcessor())
    with pytest.warns(UserWarning, match="custom processor CustomProcessor"):
        report = lkd.inject(model)
    assert report.patched["LTXAttention self-attention (ltx_qk_norm_rope)"] == 1
    assert any("forward: some blocks stay stock" in s for s in report.skipped)
    torch.testing.assert_close(model(**kw)[0], expected, atol=1e-4, rtol=1e-3)


def test_unsupported_dtype_warns_and_patches_nothing():
    model = tiny_model("cpu").double()
    with pytest.warns(UserWarning, match="float64"):
        report = lkd.inject(model)
    assert not report.patched


def test_bad_argument_names_it():
    with pytest.raises(TypeError, match="inject: pipe_or_model must be a diffusers pipeline or model"):
        lkd.inject("LTX-Video")
    with pytest.raises(TypeError, match="Linear holding no diffusers module"):
        lkd.inject(torch.nn.Linear(3, 3))


@pytest.mark.parametrize("device", DEVICES)
@torch.no_grad()
def test_generic_patches_by_class(device):
    from diffusers.models.activations import GEGLU, GELU, SwiGLU
    from diffusers.models.normalization import RMSNorm

    torch.manual_seed(0)
    modules = torch.nn.ModuleList([
        RMSNorm(24, eps=1e-6, elementwise_affine=True), RMSNorm(24, eps=1e-6, elementwise_affine=False),
        torch.nn.RMSNorm(24), GELU(24, 24, approximate="tanh"), GEGLU(24, 24), SwiGLU(24, 24),
        RMSNorm(24, eps=1e-6, elementwise_affine=True, bias=True), GELU(24, 24),
    ]).to(device)
    for p in modules.parameters():
        p.normal_()
    x = torch.randn(5, 24, device=device)
    expected = [m(x) for m in modules]
    with pytest.warns(UserWarning, match="RMSNorm with bias"):
        report = lkd.inject(modules)
    assert sum(report.patched.values()) == 6
    for m, e in zip(modules, expected):
        torch.testing.assert_close(m(x), e, atol=1e-5, rtol=1e-5)
    # A channels-last view (last dim strided), as LTX's VAE normalizes.
    xt = torch.randn(2, 24, 5, device=device).transpose(1, 2)
    lkd.remove(modules)
    expected_t = modules[0](xt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lkd.inject(modules)
    torch.testing.assert_close(modules[0](xt), expected_t, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("config", ["2b", "13b"])
@torch.no_grad()
def test_full_size(config):
    """Full-size random weights, one step at 9 frames 256x384 (S = 2 * 8 * 12), per-batch
    and per-token timesteps: patched bf16 vs stock fp32 no worse than stock bf16."""
    reference = ltx_models.random_transformer(config, torch.float32, "cuda")
    kw = ltx_models.step_inputs(reference, batch=2, num_frames=9, height=256, width=384)
    per_token = dict(kw, timestep=torch.rand(2, kw["hidden_states"].shape[1], device="cuda") * 1000)
    expected = [reference(**kw)[0], reference(**per_token)[0]]
    model = torch.nn.Module.to(reference, torch.bfloat16)
    stock_err = [rel_err(model(**as_dtype(k, torch.bfloat16))[0], e) for k, e in zip((kw, per_token), expected)]
    lkd.inject(model)
    ours_err = [rel_err(model(**as_dtype(k, torch.bfloat16))[0], e) for k, e in zip((kw, per_token), expected)]
    for ours, stock in zip(ours_err, stock_err):
        assert ours <= SLACK * stock, (ours_err, stock_err)

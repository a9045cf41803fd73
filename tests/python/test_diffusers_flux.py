"""FLUX.1 under inject (issue 20, first step): the fused double- and single-stream blocks, the
RoPE processor and the AdaLN-Zero norms against the stock model, in fp32 and bf16, with hooks,
a custom processor, the attention backend, compile, FP8, training and remove()."""

import copy

import pytest
import torch

from conftest import rel_err

pytest.importorskip("diffusers")
from diffusers import FluxTransformer2DModel  # noqa: E402
from diffusers.models.normalization import AdaLayerNormZero  # noqa: E402

import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels.integrations.diffusers import flux  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402


def tiny_flux(seed=0):
    """fp32 tiny FLUX transformer (D = 64); the AdaLN linears scaled up so that the modulation
    is not near zero (the default init would make the blocks near-identity)."""
    torch.manual_seed(seed)
    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                   attention_head_dim=32, num_attention_heads=2, joint_attention_dim=48,
                                   pooled_projection_dim=16, axes_dims_rope=(8, 12, 12)).eval()
    for name, p in model.named_parameters():
        if "norm" in name and "linear" in name:
            p.data.normal_(0.0, 0.3)
    return model.requires_grad_(False)


def flux_kwargs(dtype=torch.float32, batch=2, image_tokens=24, text_tokens=7, seed=0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(image_tokens / 4),
                                     indexing="ij")).reshape(3, -1).T
    return dict(hidden_states=randn(batch, image_tokens, 16), encoder_hidden_states=randn(batch, text_tokens, 48),
                pooled_projections=randn(batch, 16), timestep=torch.tensor([0.3, 0.8][:batch]).to(dtype),
                img_ids=ids, txt_ids=torch.zeros(text_tokens, 3), return_dict=False)


def inject_quietly(model, **kwargs):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lkd.inject(model, **kwargs)


# Features the family tests compose with inject (COMPOSE in each file), shared by all.
def layerwise_casting_fp8(model):
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)


def group_offload_block_level(model):
    model.enable_group_offload(torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1)


def assert_composes_with_inject(base, kwargs, feature, order, kind, count):
    """``feature(model)`` before or after inject (``order``) gives the output of a stock copy
    with the feature (within 1e-5), ``count`` modules of ``kind`` patched, and remove() gives
    it exactly. Returns that expected output (callers check that the feature is active)."""
    stock = copy.deepcopy(base)
    feature(stock)
    expected = stock(**kwargs())[0]
    model = copy.deepcopy(base)
    if order == "feature_then_inject":
        feature(model)
    report = inject_quietly(model)
    if order == "inject_then_feature":
        feature(model)
    assert report.patched[kind] == count, report
    assert rel_err(model(**kwargs())[0], expected) < 1e-5
    assert lkd.remove(model) > 0
    assert torch.equal(model(**kwargs())[0], expected)
    return expected


def assert_bf16_no_worse_than_stock(reference, stock16, inputs, **inject_kwargs):
    """An injected copy of the bf16 model ``stock16`` is no further from the fp32 ``reference``
    than ``stock16`` itself (``inputs(dtype)``: the model's kwargs); returns the report."""
    ours16 = copy.deepcopy(stock16)
    report = inject_quietly(ours16, **inject_kwargs)
    with torch.no_grad():
        ref = reference(**inputs(torch.float32))[0]
        err_stock = rel_err(stock16(**inputs(torch.bfloat16))[0], ref)
        err_ours = rel_err(ours16(**inputs(torch.bfloat16))[0], ref)
    assert err_ours <= 1.1 * err_stock, (err_ours, err_stock)
    return report


def assert_hooked_call_runs(stock, target, kwargs):
    """A forward hook on ``target`` of an injected copy of ``stock`` sees its call (a fused
    forward runs that part unfused) and the output stays stock's."""
    model = copy.deepcopy(stock)
    inject_quietly(model)
    seen = []
    model.get_submodule(target).register_forward_hook(lambda m, i, o: seen.append(m))
    with torch.no_grad():
        assert rel_err(model(**kwargs)[0], stock(**kwargs)[0]) < 1e-5
    assert seen


def assert_trains_like_stock(stock, kwargs):
    """``stock`` and an injected copy in train mode: every patched module has a backward and each
    parameter's gradient is stock's (None where stock's is, e.g. a last block's unused context),
    within 1e-4 of its norm plus 1e-7 of the largest gradient's (a gradient that is zero in
    exact arithmetic, e.g. a key bias's under softmax, is rounding noise in both)."""
    stock.train().requires_grad_(True)
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    assert any("every patched module has a backward" in n for n in report.notes), report.notes
    stock(**kwargs)[0].square().mean().backward()
    model(**kwargs)[0].square().mean().backward()
    floor = 1e-7 * max(p.grad.norm().item() for p in stock.parameters() if p.grad is not None)
    for (name, p), q in zip(stock.named_parameters(), model.parameters()):
        if p.grad is None:
            assert q.grad is None, name
            continue
        assert q.grad is not None, name
        diff = (q.grad - p.grad).norm().item()
        assert diff <= 1e-4 * p.grad.norm().item() + floor, (name, diff, p.grad.norm().item())


def assert_fp8_within_format_error(stock, kwargs):
    """An FP8-injected copy of ``stock`` runs, within the format's error; returns the report."""
    model = copy.deepcopy(stock)
    report = inject_quietly(model, precision="fp8")
    with torch.no_grad():
        err = rel_err(model(**kwargs)[0], stock(**kwargs)[0])
    assert 0 < err < 5e-2, err
    return report


def test_fused_blocks_match_stock_fp32():
    stock = tiny_flux()
    model = copy.deepcopy(stock)
    report = inject_quietly(model)
    for kind in (flux.BLOCK_KIND, flux.SINGLE_KIND, flux.ADALN_KIND, flux.ADALN_SINGLE_KIND, flux.ATTN_KIND):
        assert report.patched[kind] > 0, report
    assert report.patched[flux.BLOCK_KIND] == 2 and report.patched[flux.SINGLE_KIND] == 2
    assert report.patched[flux.ATTN_KIND] == 4  # every block's attention: our RoPE
    with torch.no_grad():
        assert rel_err(model(**flux_kwargs())[0], stock(**flux_kwargs())[0]) < 1e-5


def test_bf16_is_as_close_to_fp32_as_stock_bf16():
    """Our bf16 model's error against stock fp32 is no worse than stock bf16's (we round once
    where stock rounds twice)."""
    reference = tiny_flux()
    assert_bf16_no_worse_than_stock(reference, copy.deepcopy(reference).to(torch.bfloat16), flux_kwargs)


@pytest.mark.parametrize("target", ["transformer_blocks.0.norm1", "transformer_blocks.0.norm2",
                                    "transformer_blocks.1.norm2_context", "single_transformer_blocks.0.norm.norm",
                                    "single_transformer_blocks.1.proj_mlp", "transformer_blocks.0.ff"])
def test_hooks_on_fused_submodules_run(target):
    """A hook on a norm or projection that a fused forward reads in place sees its call (the
    fused forward runs that part unfused), and the output stays stock's."""
    assert_hooked_call_runs(tiny_flux(), target, flux_kwargs())


def test_remove_restores_stock():
    stock = tiny_flux()
    model = copy.deepcopy(stock)
    inject_quietly(model)
    assert lkd.remove(model) > 0
    assert not any(is_patched(m) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(**flux_kwargs())[0], stock(**flux_kwargs())[0])


def test_fp32_layer_norm_adaln_is_skipped_and_reported():
    norm = AdaLayerNormZero(32, norm_type="fp32_layer_norm")
    holder = torch.nn.ModuleDict({"norm": norm})
    report = inject_quietly(holder)
    assert not is_patched(norm)
    assert any("AdaLayerNormZero" in s and "FP32LayerNorm" in s for s in report.skipped), report.skipped


def test_compile_fullgraph():
    model = tiny_flux()
    inject_quietly(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert rel_err(compiled(**flux_kwargs())[0], model(**flux_kwargs())[0]) < 1e-6


def test_trains_like_stock():
    """In train mode every patched module has a backward; gradients match stock's."""
    assert_trains_like_stock(tiny_flux(), flux_kwargs())


def test_fp8_runs_within_the_format_error():
    report = assert_fp8_within_format_error(tiny_flux(), flux_kwargs())
    assert report.patched[flux.BLOCK_KIND] == 2


def test_fp8_projections_share_quantizations_and_gemms_write_gated_residuals(monkeypatch):
    """inject(precision="fp8") on FLUX: each stream's q/k/v read one quantization of their
    input, a single block's q/k/v and proj_mlp one of its norm's output (each written by the
    AdaLN norm itself, as the FFs' inputs are), and every gated
    residual is written by the GEMM before it (the double blocks' output projections and
    feed-forward down projections, the single blocks' proj_out: 4 + 4 + 2 = 10 in the tiny
    model), with no gated_residual pass; the output stays within the format's error, and is
    what the same model computes with those fusions off (a hook on each fused module)."""
    from test_fp8 import fp8_fused_run

    from ltx_kernels import _fp8

    stock = tiny_flux()
    model = copy.deepcopy(stock)
    inject_quietly(model, precision="fp8")
    gelus = []
    got, unfused, calls, fused, passes = fp8_fused_run(
        model, flux_kwargs(), monkeypatch, ("attn", "proj_mlp", "proj_out", "to_out.0", "to_add_out", "ff", "ff_context"),
        gelus)
    with torch.no_grad():
        reference = stock(**flux_kwargs())[0]
    assert len(fused) == 10 and not passes
    # per double block: q/k/v of each stream, the two output projections' inputs, each FF's
    # input and its hidden values (their GELU in the up projection's GEMM); per single block:
    # the shared input, proj_out's; and one for each other FP8 linear (embedders, the AdaLN
    # modulations' linears), called once
    blocks = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
              "net.0.proj", "net.2", "proj_mlp", "proj_out")
    others = [n for n, m in model.named_modules() if _fp8.is_quantized(m) and not n.endswith(blocks)]
    assert len(others) == 12
    assert len(calls) == len(others) + 2 * 8 + 2 * 2 and calls.count("gelu_tanh") == 0, calls
    assert gelus == ["gelu_tanh"] * 2 * 2
    # the norms write their outputs quantized: per double block norm1, norm1_context and both
    # FFs' norms, per single block its norm
    assert calls.count("adaln_layer_norm_fp8") == 2 * 4 + 2 * 1, calls
    assert 0 < rel_err(got, reference) < 5e-2
    assert rel_err(got, unfused) < 1e-2  # the same FP8 roundings but the residuals' (rounded once)


def test_fp8_single_block_out_projection_is_two_gemms_in_bf16(monkeypatch):
    """In bf16 under FP8, a single block's proj_out runs as two GEMMs over its weight's column
    blocks (flux._split_out_projection), each writing the gated residual: the attention's output
    and the MLP's, each quantized on its own, the GELU inside the MLP's quantization, so act_mlp
    never runs and nothing is concatenated for proj_out. The output stays within the format's
    error of stock, and close to the one-GEMM form of the same model."""
    from test_fp8 import count_quantizations

    from ltx_kernels import _fp8

    kw = flux_kwargs(dtype=torch.bfloat16)
    stock = tiny_flux().to(torch.bfloat16)
    model = copy.deepcopy(stock)
    inject_quietly(model, precision="fp8")
    with torch.no_grad():
        monkeypatch.setattr(flux, "_splits_out_projection", lambda *args: False)
        one_gemm = model(**kw)[0]
        monkeypatch.undo()
    activations = []
    for block in model.single_transformer_blocks:
        block.act_mlp.register_forward_hook(lambda m, i, o: activations.append(m))
    gelus = []
    calls = count_quantizations(monkeypatch, gelus)
    fused = []
    gemm = _fp8.ops.fp8_linear_gated_residual
    monkeypatch.setattr(flux.ops, "fp8_linear_gated_residual", lambda *args: fused.append(args) or gemm(*args))
    with torch.no_grad():
        got = model(**kw)[0]
        reference = stock(**kw)[0]
    # the double blocks' 8 on whole weights, then per single block its weight's two column blocks
    split = [args[2] for args in fused if not args[2].is_contiguous()]
    assert len(fused) == 2 * 4 + 2 * 2 and len(split) == 2 * 2 and not activations
    for block, (first, second) in zip(model.single_transformer_blocks, (split[:2], split[2:])):
        weight = block.proj_out.weight  # [64, 64 + 256]: the attention's 64 columns, the MLP's 256
        assert first.data_ptr() == weight.data_ptr() and first.shape == (64, 64)
        assert second.data_ptr() == weight.data_ptr() + 64 and second.shape == (64, 256)
    # the GELU of each single block's MLP in its quantization, each FF's in its up projection
    assert calls.count("gelu_tanh") == 2 and gelus == ["gelu_tanh"] * 2 * 2, calls
    assert 0 < rel_err(got, reference) < 5e-2
    assert rel_err(got, one_gemm) < 2e-2  # each part's own row scales; the first sum rounded once more


@pytest.mark.parametrize("target", ["transformer_blocks.0.attn", "transformer_blocks.0.attn.to_out.0",
                                    "transformer_blocks.0.attn.to_add_out", "transformer_blocks.0.attn.to_q",
                                    "transformer_blocks.1.ff", "transformer_blocks.1.ff_context.net.2",
                                    "single_transformer_blocks.0.attn", "single_transformer_blocks.0.proj_out",
                                    "single_transformer_blocks.1.proj_mlp", "transformer_blocks.0.norm1",
                                    "transformer_blocks.1.norm1_context", "transformer_blocks.0.norm2",
                                    "single_transformer_blocks.1.norm", "single_transformer_blocks.0.norm.norm"])
def test_fp8_hooks_on_shared_or_fused_modules_run(target):
    """Under precision="fp8", a forward hook on a module whose input would be shared or whose
    output a GEMM would fold into the residual sees its call (that part runs unfused) and the
    output stays within the format's error."""
    stock = tiny_flux()
    model = copy.deepcopy(stock)
    inject_quietly(model, precision="fp8")
    seen = []
    model.get_submodule(target).register_forward_hook(lambda m, i, o: seen.append(m))
    with torch.no_grad():
        assert 0 < rel_err(model(**flux_kwargs())[0], stock(**flux_kwargs())[0]) < 5e-2
    assert seen


def test_single_blocks_rejoin_their_outputs_without_a_copy():
    """A single block's (text, image) outputs are views of one tensor; the next block's
    concatenation of them is that tensor again (flux._joined), a view. Anything else (other
    tensors, the parts swapped, a strided copy, autograd recording) is torch.cat's copy."""
    whole = torch.randn(2, 7 + 24, 16)
    text, image = whole[:, :7], whole[:, 7:]
    joined = flux._joined(text, image)
    assert joined.data_ptr() == whole.data_ptr() and torch.equal(joined, whole)
    for a, b in [(text.clone(), image), (image, text), (text, image[:, ::2]), (whole[:1, :7], whole[1:, 7:])]:
        out = flux._joined(a, b)
        assert out.data_ptr() != whole.data_ptr() and torch.equal(out, torch.cat([a, b], dim=1))
    leaf = whole.clone().requires_grad_()
    assert flux._joined(leaf[:, :7], leaf[:, 7:]).data_ptr() != leaf.data_ptr()
    model = tiny_flux()
    stock = copy.deepcopy(model)
    inject_quietly(model)
    with torch.no_grad():
        assert rel_err(model(**flux_kwargs())[0], stock(**flux_kwargs())[0]) < 1e-5


def test_benchmark_inputs_run_on_the_tiny_config():
    """The FLUX benchmark's model and inputs (its GPU run uses the full 'dev' config), on the
    CPU at the tiny one, stock and injected."""
    from ltx_kernels.bench import flux_e2e

    model = flux_e2e.random_transformer("tiny", torch.float32, "cpu")
    kw = flux_e2e.step_inputs(model, 64, 96, 7, "cpu")
    with torch.no_grad():
        ref = model(**kw)[0]
        inject_quietly(model)
        assert ref.shape == (1, 24, 16) and rel_err(model(**kw)[0], ref) < 1e-5


def test_benchmark_inputs_of_an_fp8_model_are_in_its_compute_dtype():
    """After inject(precision="fp8") FLUX's first parameter is an FP8 weight: the benchmark's
    inputs still come in the dtype the model computes in (an H100 run failed on this)."""
    from ltx_kernels.bench import flux_e2e

    model = flux_e2e.random_transformer("tiny", torch.bfloat16, "cpu")
    inject_quietly(model, precision="fp8")
    assert next(model.parameters()).dtype == torch.float8_e4m3fn
    kw = flux_e2e.step_inputs(model, 64, 96, 7, "cpu")
    assert kw["hidden_states"].dtype == kw["encoder_hidden_states"].dtype == torch.bfloat16
    with torch.no_grad():
        assert model(**kw)[0].dtype == torch.bfloat16


def test_custom_processor_stays_and_backend_reaches_ours():
    """A block whose attention has a processor of the user's keeps it (reported); a backend set
    after inject reaches our processor and the stock one beneath it."""
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    class Custom(FluxAttnProcessor):
        pass

    model = tiny_flux()
    model.transformer_blocks[0].attn.set_processor(Custom())
    report = inject_quietly(model)
    assert report.patched[flux.ATTN_KIND] == 3
    assert any("Custom" in s for s in report.skipped), report.skipped
    model.set_attention_backend("native")
    ours = model.transformer_blocks[1].attn.processor
    assert isinstance(ours, flux.FluxKernelsAttnProcessor)
    assert ours._attention_backend is not None and ours._stock._attention_backend is ours._attention_backend

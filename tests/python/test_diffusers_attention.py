"""ltx_kernels.attention as diffusers attention backends ("ltx_kernels", "ltx_kernels_8bit") and
inject(..., attention=...): registration and selection through diffusers' own API, the tiny LTX
model against stock and against an emulation, the text padding mask, remove(), bad values,
FP8 composition, torch.compile, context parallelism; then the same on CUDA.

The emulation (:func:`emulated`) is diffusers' native backend with ``scaled_dot_product_attention``
replaced by ``ltx_kernels.attention`` called directly: the same op on the same values, reached
through none of the backends' code (layout, mask handling), so a backend that runs the op as
SDPA would gives exactly its output.
"""

from types import SimpleNamespace

import pytest
import torch

import ltx_kernels
from conftest import HAS_CUDA, TOLERANCE, assert_close, rel_err

pytest.importorskip("diffusers")
import ltx_kernels.diffusers as lkd  # noqa: E402
from diffusers.models.attention_dispatch import (  # noqa: E402
    AttentionBackendName,
    _AttentionBackendRegistry,
    attention_backend,
    dispatch_attention_fn,
)
from ltx_kernels import _diffusers_attention  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from test_attention import ERROR_RANDN  # noqa: E402
from test_diffusers_fp8 import FP8_TOLERANCE, inject_quietly, model16  # noqa: E402
from test_diffusers_ltx import SLACK, as_dtype, bf16_copy, step_kwargs, tiny_model  # noqa: E402

BACKEND = {"bf16": "ltx_kernels", "8bit": "ltx_kernels_8bit"}
# Per LTX block: attn1 and attn2.
ATTENTION_PER_BLOCK = 2
# attention="bf16" against our kernels with SDPA, fp32 model: both compute attention in fp32 or
# better (the op: fp32 scores, softmax and P v in fp64, one rounding), so the outputs differ by
# fp32 rounding (measured 1.4e-7); the op tests' fp32 bound.
EXACT_TOLERANCE = TOLERANCE[torch.float32]


@pytest.fixture(autouse=True)
def keep_process_default_backend():
    """set_attention_backend also sets diffusers' process-wide default: put it back."""
    active = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry.set_active_backend(active)


def emulated(monkeypatch, precision, run):
    """run() with SDPA replaced by ltx_kernels.attention(precision=...): what a model on our
    backend must compute."""

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        assert dropout_p == 0.0 and not is_causal
        return ltx_kernels.attention(query, key, value, attn_mask=attn_mask, scale=scale, precision=precision)

    with monkeypatch.context() as m:
        m.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
        return run()


def backends(model):
    return [getattr(m.processor, "_attention_backend", None) for m in model.modules() if hasattr(m, "processor")]


def kernels_patched(model):
    return any(is_patched(m) for m in model.modules())


def test_backends_registered_once_with_their_properties():
    names = list(AttentionBackendName)
    for precision, name in BACKEND.items():
        member = AttentionBackendName(name)
        assert member.value == name and AttentionBackendName.__members__[name.upper()] is member
        assert member in _AttentionBackendRegistry.list_backends()
        assert _AttentionBackendRegistry._is_context_parallel_available(member)  # Ulysses (see the ring test)
        assert {"attn_mask", "scale", "enable_gqa", "_parallel_config"} <= _AttentionBackendRegistry._supported_arg_names[member]
    assert _diffusers_attention.register()  # idempotent: the same members, one each
    assert list(AttentionBackendName) == names
    assert sum(m.value.startswith("ltx_kernels") for m in names) == 2


@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@torch.no_grad()
def test_selected_with_diffusers_api_on_the_stock_model(monkeypatch, precision):
    """set_attention_backend and the attention_backend(...) context manager run our backend in
    the stock processor: exactly the emulation, and not SDPA."""
    model = tiny_model("cpu")
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    sdpa = model(**kw)[0]
    expected = emulated(monkeypatch, precision, lambda: model(**kw)[0])
    assert rel_err(expected, sdpa) > 1e-7
    with attention_backend(BACKEND[precision]):
        assert torch.equal(model(**kw)[0], expected)
    assert _AttentionBackendRegistry._active_backend == AttentionBackendName.NATIVE
    model.set_attention_backend(BACKEND[precision])
    assert backends(model) == [AttentionBackendName(BACKEND[precision])] * 4
    assert torch.equal(model(**kw)[0], expected)


@torch.no_grad()
def test_8bit_backend_runs_text_cross_attention_exact():
    """The 8-bit backend's one exception: at least MIN_TOKENS queries against at most
    ATTENTION_SHORT_KEYS keys (a DiT's text cross-attention) get exact attention, bitwise the
    op's; one query fewer, or one key more, and it is the 8-bit method again."""
    g = torch.Generator().manual_seed(20)
    queries, keys = _diffusers_attention.MIN_TOKENS, ltx_kernels.ops.ATTENTION_SHORT_KEYS

    def outputs(sq, sk):
        q, k, v = (torch.randn(1, s, 2, 64, generator=g) for s in (sq, sk, sk))
        ours = dispatch_attention_fn(q, k, v, backend="ltx_kernels_8bit")
        op = {p: ltx_kernels.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       precision=p).transpose(1, 2) for p in ("bf16", "8bit")}
        assert not torch.equal(op["bf16"], op["8bit"])
        return ours, op

    ours, op = outputs(queries, keys)
    assert torch.equal(ours, op["bf16"])
    for sq, sk in ((queries - 1, keys), (queries, keys + 1)):
        ours, op = outputs(sq, sk)
        assert torch.equal(ours, op["8bit"])


@torch.no_grad()
def test_inject_bf16_matches_stock(monkeypatch):
    reference = tiny_model("cpu")
    kw = step_kwargs(reference, "interpolation_scale", per_token=False)
    expected = reference(**kw)[0]
    lkd.inject(reference)
    sdpa = reference(**kw)[0]
    emulation = emulated(monkeypatch, "bf16", lambda: reference(**kw)[0])
    report = lkd.inject(reference, attention="bf16")
    assert report.patched == {"LTXAttention (attention backend 'ltx_kernels')": 2 * ATTENTION_PER_BLOCK}
    out = reference(**kw)[0]
    assert torch.equal(out, emulation)
    assert rel_err(out, sdpa) <= EXACT_TOLERANCE

    # bf16 model: against fp32 stock no worse than stock bf16 (DESIGN.md section 4's bar).
    stock = bf16_copy(tiny_model("cpu"))
    stock_err = rel_err(stock(**as_dtype(kw, torch.bfloat16))[0], expected)
    lkd.inject(stock, attention="bf16")
    ours_err = rel_err(stock(**as_dtype(kw, torch.bfloat16))[0], expected)
    assert ours_err <= SLACK * stock_err, (ours_err, stock_err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_inject_8bit_matches_the_emulation(monkeypatch, dtype):
    """Exactly the emulation; against fp32 stock, within the op's own error target on randn
    (each attention call is within it; measured 1e-3 on this model) and visibly 8-bit."""
    reference = tiny_model("cpu")
    kw = step_kwargs(reference, "interpolation_scale", per_token=False)
    expected = reference(**kw)[0]
    model = torch.nn.Module.to(tiny_model("cpu"), dtype)
    kw = as_dtype(kw, dtype)
    lkd.inject(model)
    emulation = emulated(monkeypatch, "8bit", lambda: model(**kw)[0])
    lkd.inject(model, attention="8bit")
    out = model(**kw)[0]
    assert torch.equal(out, emulation)
    err = rel_err(out, expected)
    assert err <= ERROR_RANDN, err
    if dtype == torch.float32:
        assert err > 1e-4, err  # not exact attention


@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@torch.no_grad()
def test_text_padding_mask_is_honoured(precision):
    """Sample 0's last text tokens are padding (step_kwargs): changing one leaves the output
    alone, changing a kept token does not. 8-bit: the masked key still enters K's channel mean
    and its block's scale (the op's definition), so the output moves by quantization noise
    (measured 4e-4), not by the key's content (a kept token: 0.1)."""
    model = tiny_model("cpu")
    lkd.inject(model, attention=precision)
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    assert kw["encoder_attention_mask"][0, -1] == 0 and kw["encoder_attention_mask"][0, 0] == 1
    out = model(**kw)[0]

    def changed(token):
        text = kw["encoder_hidden_states"].clone()
        text[0, token] += 3 * torch.randn(text.shape[-1], generator=torch.Generator().manual_seed(token))
        return model(**dict(kw, encoder_hidden_states=text))[0]

    masked = changed(-1)
    if precision == "bf16":
        assert torch.equal(masked, out)
    else:
        assert torch.equal(masked[1], out[1]) and rel_err(masked[0], out[0]) < 5e-3
    assert rel_err(changed(0)[0], out[0]) > 5e-2


@torch.no_grad()
def test_remove_restores_each_processors_backend():
    """inject(attention=None) keeps the user's backend; attention= replaces it (said in the
    notes) and switches on a second call; remove() restores the user's, but a backend set after
    inject stays. diffusers' process-wide default is never changed."""
    model = tiny_model("cpu")
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    model.set_attention_backend("_native_math")
    _AttentionBackendRegistry.set_active_backend(AttentionBackendName.NATIVE)
    user = [AttentionBackendName._NATIVE_MATH] * 4
    expected = model(**kw)[0]
    report = lkd.inject(model)
    assert backends(model) == user and not report.notes
    report = lkd.inject(model, attention="8bit")
    assert backends(model) == [AttentionBackendName.LTX_KERNELS_8BIT] * 4
    assert report.notes == ["LTXVideoTransformer3DModel: attention backend '_native_math', set before inject, "
                            "replaced by 'ltx_kernels_8bit' on 4 modules; remove() restores it"]
    out_8bit = model(**kw)[0]
    assert lkd.inject(model, attention="8bit").patched == {}  # nothing new
    report = lkd.inject(model, attention="bf16")
    assert backends(model) == [AttentionBackendName.LTX_KERNELS] * 4 and not report.notes
    assert not torch.equal(model(**kw)[0], out_8bit)
    assert _AttentionBackendRegistry._active_backend == AttentionBackendName.NATIVE
    assert lkd.remove(model) == 9 + 4
    assert backends(model) == user
    assert torch.equal(model(**kw)[0], expected)

    lkd.inject(model, attention="8bit")
    model.transformer_blocks[0].attn1.processor._attention_backend = AttentionBackendName.NATIVE  # the user's, since
    lkd.remove(model)
    assert backends(model) == [AttentionBackendName.NATIVE] + user[1:]


def test_bad_values_raise_before_the_model_is_touched():
    model = tiny_model("cpu")
    for value in ("fp8", "int8", "sdpa", True):
        with pytest.raises(ValueError, match=f"inject: attention must be None, 'bf16' or '8bit', got {value!r}"):
            lkd.inject(model, attention=value)
    # Ring attention needs the log-sum-exp, which the op does not return.
    processor = model.transformer_blocks[1].attn2.processor
    processor._parallel_config = SimpleNamespace(context_parallel_config=SimpleNamespace(ring_degree=2))
    with pytest.raises(ValueError, match=r"attention='8bit' cannot run LTXVideoTransformer3DModel\."
                                         r"transformer_blocks\.1\.attn2: .* ring_degree 2"):
        lkd.inject(model, attention="8bit")
    assert not kernels_patched(model) and backends(model) == [None] * 4


def qkv_bshd(b=2, s=9, sk=13, h=4, hkv=4, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, s, h, d, generator=g), torch.randn(b, sk, hkv, d, generator=g),
            torch.randn(b, sk, hkv, d, generator=g))


@pytest.mark.parametrize("precision", ["bf16", "8bit"])
def test_backend_semantics_and_refusals(precision):
    """[B, S, H, D] in and out; scale; bool, additive and [B, Sk] key-padding masks as diffusers'
    native backend reads them; GQA with enable_gqa; what the op does not compute raises,
    naming the backend and the argument."""
    name = BACKEND[precision]
    q, k, v = qkv_bshd()

    def ours(q, k, v, **kwargs):
        return dispatch_attention_fn(q, k, v, backend=name, **kwargs)

    def op(q, k, v, **kwargs):
        out = ltx_kernels.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), precision=precision,
                                    **kwargs)
        return out.transpose(1, 2)

    assert torch.equal(ours(q, k, v, scale=0.3), op(q, k, v, scale=0.3))
    if precision == "bf16":
        sdpa = dispatch_attention_fn(q, k, v, scale=0.3, backend="native")
        assert rel_err(ours(q, k, v, scale=0.3), sdpa) <= EXACT_TOLERANCE
    padding = torch.ones(2, 13, dtype=torch.bool)
    padding[1, 5:] = False
    additive = torch.randn(2, 4, 9, 13)
    assert torch.equal(ours(q, k, v, attn_mask=padding), op(q, k, v, attn_mask=padding[:, None, None]))
    assert not torch.equal(ours(q, k, v, attn_mask=padding), ours(q, k, v))
    assert torch.equal(ours(q, k, v, attn_mask=additive), op(q, k, v, attn_mask=additive))
    q2, k2, v2 = qkv_bshd(hkv=2)
    gqa = ours(q2, k2, v2, enable_gqa=True)
    assert torch.equal(gqa, ours(q2, k2.repeat_interleave(2, 2), v2.repeat_interleave(2, 2)))

    refusals = [
        (dict(dropout_p=0.1), "dropout_p must be 0"),
        (dict(is_causal=True), "is_causal=True is not supported"),
        (dict(attention_kwargs={"return_lse": True}), "return_lse=True is not supported"),
    ]
    for kwargs, message in refusals:
        with pytest.raises(ValueError, match=f"attention backend '{name}': {message}"):
            ours(q, k, v, **kwargs)
    with pytest.raises(ValueError, match=f"attention backend '{name}': query has 4 heads and key 2: pass enable_gqa"):
        ours(q2, k2, v2)


def autograd_ctx():
    """What an autograd.Function hands diffusers' templated attention's forward op: an object
    to save tensors on."""
    ctx = SimpleNamespace()
    ctx.save_for_backward = lambda *tensors: setattr(ctx, "saved_tensors", tensors)
    return ctx


@pytest.mark.parametrize("precision", ["bf16", "8bit"])
def test_context_parallelism_ulysses_runs_ring_raises(monkeypatch, precision):
    """Ulysses simulated in one process: diffusers' all-to-all hands each rank every token of
    1 / degree of the heads and calls the backend's forward op on them; per-head attention (the
    8-bit K mean and block scales are per head too) makes the gathered result the plain one,
    exactly. (Run for real on 2 CPU ranks over gloo: 1.5e-7 from the plain run, fp32.) The
    backward op, from what the forward op saved, gives the op's own gradients. Ring attention
    raises."""
    import diffusers.models.attention_dispatch as dispatch

    def ulysses(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, *,
                forward_op, backward_op, _parallel_config):
        degree = _parallel_config.context_parallel_config.ulysses_degree
        ctx = autograd_ctx()
        out = forward_op(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                         _save_ctx=True, _parallel_config=_parallel_config)
        grad_out = torch.randn_like(out)
        leaves = [x.detach().requires_grad_() for x in (query, key, value)]
        dispatch_attention_fn(*leaves, attn_mask=attn_mask, scale=scale, backend=name).backward(grad_out)
        for got, want in zip(backward_op(ctx, grad_out), leaves):
            assert_close(got, want.grad, query.dtype)
        shards = zip(*(x.chunk(degree, dim=2) for x in (query, key, value)))
        return torch.cat([forward_op(autograd_ctx(), *shard, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                     return_lse, _save_ctx=True, _parallel_config=_parallel_config)
                          for shard in shards], dim=2)

    monkeypatch.setattr(dispatch, "_templated_context_parallel_attention", ulysses)
    name = BACKEND[precision]
    q, k, v = qkv_bshd(s=70, sk=70)
    mask = torch.ones(2, 1, 1, 70, dtype=torch.bool)
    mask[0, ..., 60:] = False
    config = SimpleNamespace(context_parallel_config=SimpleNamespace(ring_degree=1, ulysses_degree=2))
    out = dispatch_attention_fn(q, k, v, attn_mask=mask, backend=name, parallel_config=config)
    assert torch.equal(out, dispatch_attention_fn(q, k, v, attn_mask=mask, backend=name))
    config.context_parallel_config.ring_degree = 2
    with pytest.raises(ValueError, match=f"attention backend '{name}': ring attention .* not supported"):
        dispatch_attention_fn(q, k, v, backend=name, parallel_config=config)


@torch.no_grad()
def test_other_diffusers_attention_modules(monkeypatch):
    """A stock processor of another model family (FLUX's) gets the backend too; a processor
    that computes attention itself (AttnProcessor2_0) is reported, and warned about."""
    from diffusers.models.attention_processor import Attention
    from diffusers.models.transformers.transformer_flux import FluxAttention

    torch.manual_seed(0)
    modules = torch.nn.ModuleList([FluxAttention(query_dim=32, heads=2, dim_head=16), Attention(32, heads=2, dim_head=16)])
    x = torch.randn(2, 11, 32)
    expected = emulated(monkeypatch, "8bit", lambda: modules[0](x))
    assert rel_err(expected, modules[0](x)) > 1e-4
    with pytest.warns(UserWarning, match="1 attention modules with AttnProcessor2_0, which does not call diffusers' "
                                         "attention dispatcher: not 'ltx_kernels_8bit'"):
        report = lkd.inject(modules, attention="8bit")
    assert report.patched["FluxAttention (attention backend 'ltx_kernels_8bit')"] == 1
    torch.testing.assert_close(modules[0](x), expected, atol=1e-5, rtol=1e-5)
    lkd.remove(modules)
    assert backends(modules)[0] is None


@torch.no_grad()
def test_composes_with_fp8(monkeypatch):
    """precision="fp8" with attention="8bit": both in the report, exactly the emulation on the
    FP8 model, within FP8's bound of fp32 stock. A second inject on the FP8 model (one-way,
    nothing else patched again) still switches the attention."""
    stock = model16("cpu")
    kw = step_kwargs(stock, "interpolation_scale", per_token=False)
    expected = stock(**kw)[0]
    model = model16("cpu")
    report = inject_quietly(model, precision="fp8", attention="8bit")
    assert report.patched["nn.Linear (fp8_linear, e4m3 weights and per-token activations)"] > 0
    assert report.patched["LTXAttention (attention backend 'ltx_kernels_8bit')"] == 4
    out = model(**kw)[0]
    assert rel_err(out, expected) <= FP8_TOLERANCE
    model.set_attention_backend("native")
    assert torch.equal(emulated(monkeypatch, "8bit", lambda: model(**kw)[0]), out)
    report = inject_quietly(model, precision="fp8", attention="bf16")
    assert report.patched == {"LTXAttention (attention backend 'ltx_kernels')": 4}
    assert any("already injected with precision='fp8'" in reason for reason in report.skipped)


@torch.no_grad()
def test_torch_compile_fullgraph():
    """No graph break through diffusers' dispatcher and our backend (fullgraph=True raises on
    any); aot_eager on the CPU reproduces eager."""
    torch._dynamo.reset()
    model = tiny_model("cpu")
    lkd.inject(model, attention="8bit")
    kw = step_kwargs(model, "interpolation_scale", per_token=True)
    expected = model(**kw)[0]
    assert torch.equal(torch.compile(model, fullgraph=True, backend="aot_eager")(**kw)[0], expected)


# ---- CUDA: the kernel takes bf16/fp16 and head_dim 64 or 128, so the tiny model has D = 4 * 64 ----

cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")


@cuda
@torch.no_grad()
def test_cuda_bf16_no_worse_than_stock_and_8bit_is_the_emulation(monkeypatch):
    reference = tiny_model("cuda", head_dim=64)
    kw = step_kwargs(reference, "interpolation_scale", per_token=False)
    expected = reference(**kw)[0]
    kw = as_dtype(kw, torch.bfloat16)
    model = bf16_copy(reference)
    stock_err = rel_err(model(**kw)[0], expected)
    lkd.inject(model, attention="bf16")
    ours_err = rel_err(model(**kw)[0], expected)
    assert ours_err <= SLACK * stock_err, (ours_err, stock_err)

    lkd.inject(model, attention="8bit")
    out = model(**kw)[0]
    assert rel_err(out, expected) <= ERROR_RANDN
    model.set_attention_backend("native")
    assert torch.equal(emulated(monkeypatch, "8bit", lambda: model(**kw)[0]), out)


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
def test_cuda_unsupported_inputs_raise_naming_the_backend(precision):
    name = BACKEND[precision]
    q = torch.randn(1, 8, 2, 64, device="cuda")
    with pytest.raises(ValueError, match=f"attention backend '{name}': on CUDA, .* got torch.float32 with head_dim 64"):
        dispatch_attention_fn(q, q, q, backend=name)
    q = torch.randn(1, 8, 2, 80, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"attention backend '{name}': on CUDA, .* got torch.bfloat16 with head_dim 80"):
        dispatch_attention_fn(q, q, q, backend=name)


@cuda
@torch.no_grad()
def test_cuda_torch_compile_fullgraph():
    """Inductor; the rest of the model compiles to other bf16 kernels than eager's, so the bound
    is bf16's, not equality."""
    torch._dynamo.reset()
    model = bf16_copy(tiny_model("cuda", head_dim=64))
    lkd.inject(model, attention="8bit")
    kw = as_dtype(step_kwargs(model, "interpolation_scale", per_token=True), torch.bfloat16)
    expected = model(**kw)[0]
    compiled = torch.compile(model, fullgraph=True)(**kw)[0]
    assert rel_err(compiled, expected) <= TOLERANCE[torch.bfloat16]



@cuda
@torch.no_grad()
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cuda_default_attention_takes_our_kernel_where_faster(monkeypatch, head_dim):
    """With no attention backend chosen, an injected LTX block runs ltx_kernels.attention where
    prefers_ours says it is the faster: its cross-attention (at most 128 text tokens) from sm_80
    on, its self-attention at head dim 64 on Hopper with a build for sm_90a; the tiny model's
    few tokens run SDPA at the real bound (MIN_TOKENS) and ours with the bound at 1 (the
    long-key Hopper case is the rule's table, test_prefers_ours_is_the_measured_table). No worse
    than stock against fp32, eager and under fullgraph compile. A backend chosen with diffusers'
    API (the active one, or the model's set_attention_backend("native")) takes the dispatcher."""
    reference = tiny_model("cuda", head_dim=head_dim)
    kw = step_kwargs(reference, "interpolation_scale", per_token=False)
    expected = reference(**kw)[0]
    kw = as_dtype(kw, torch.bfloat16)
    model = bf16_copy(reference)
    stock_err = rel_err(model(**kw)[0], expected)
    lkd.inject(model)
    calls = []
    attention = ltx_kernels.ops.attention
    monkeypatch.setattr(ltx_kernels.ops, "attention", lambda *a, **k: calls.append(a[1].size(2)) or attention(*a, **k))
    text, video = kw["encoder_hidden_states"].size(1), kw["hidden_states"].size(1)
    assert video < _diffusers_attention.MIN_TOKENS
    assert rel_err(model(**kw)[0], expected) <= SLACK * stock_err
    assert calls == []
    monkeypatch.setattr(_diffusers_attention, "MIN_TOKENS", 1)
    assert rel_err(model(**kw)[0], expected) <= SLACK * stock_err
    # (the tiny video's self-attention has at most 128 keys: the short-key kernel's, as the text's)
    assert video <= ltx_kernels.ops.ATTENTION_SHORT_KEYS
    assert sorted(calls) == sorted([text, video] * len(model.transformer_blocks))
    with attention_backend("_native_cudnn"):  # a backend chosen: the dispatcher
        calls.clear()
        model(**kw)
        assert not calls
    model.set_attention_backend("native")
    calls.clear()
    model(**kw)
    assert not calls
    model.reset_attention_backend()
    monkeypatch.setattr(ltx_kernels.ops, "attention", attention)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)(**kw)[0]
    assert rel_err(compiled, expected) <= SLACK * stock_err


def _cuda_like(tokens, head_dim, dtype=torch.bfloat16):
    """What prefers_ours reads of a [B, S, H, D] CUDA tensor, without a GPU."""
    return SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype,
                           size=lambda dim: {1: tokens, -1: head_dim}[dim])


# (query rows, keys, head_dim, dtype, mask, capability, sm_90a build) -> ours?
ROUTES = [
    ((8064, 8064, 64, torch.bfloat16, False, (9, 0), True), True),   # LTX-2B self-attention
    ((8064, 8064, 64, torch.float16, False, (9, 0), True), True),
    ((4429, 4429, 64, torch.bfloat16, False, (9, 0), True), True),   # SD3.5 joint attention
    ((1536, 1536, 64, torch.bfloat16, False, (9, 0), True), True),   # the bound
    ((1535, 1535, 64, torch.bfloat16, False, (9, 0), True), False),  # under it
    ((8064, 8064, 64, torch.bfloat16, True, (9, 0), True), False),   # a mask: SDPA
    ((8064, 8064, 64, torch.bfloat16, False, (9, 0), False), False),  # no sm_90a kernel in the build
    ((8064, 8064, 64, torch.bfloat16, False, (8, 0), True), False),  # the portable kernel: SDPA
    ((8064, 8064, 64, torch.bfloat16, False, (10, 0), True), False),
    ((8064, 8064, 128, torch.bfloat16, False, (9, 0), True), False),  # head dim 128: cuDNN
    ((8064, 128, 64, torch.bfloat16, True, (9, 0), True), True),     # text cross-attention, padded
    ((8064, 128, 128, torch.bfloat16, True, (8, 0), True), True),
    ((8064, 128, 128, torch.bfloat16, True, (7, 5), True), False),
    ((8064, 129, 64, torch.bfloat16, True, (9, 0), True), False),    # past the short-key kernel, masked
    ((1000, 128, 64, torch.bfloat16, True, (9, 0), True), False),    # too few query rows
    ((8064, 128, 80, torch.bfloat16, True, (9, 0), True), False),    # a head dim the kernels lack
    ((8064, 128, 64, torch.float32, True, (9, 0), True), False),
]


@pytest.mark.parametrize(("case", "ours"), ROUTES)
def test_prefers_ours_is_the_measured_table(monkeypatch, case, ours):
    """The routing rule of every integrated family (prefers_ours), case by case, on stand-ins of
    CUDA tensors: what benchmarks/results/h100/attention.md measured faster."""
    tokens, keys, head_dim, dtype, masked, capability, sm90a = case
    monkeypatch.setattr(_diffusers_attention, "device_capability", lambda index: capability)
    monkeypatch.setattr(ltx_kernels.ops, "SM90A_KERNELS", sm90a)
    query, key = _cuda_like(tokens, head_dim, dtype), _cuda_like(keys, head_dim, dtype)
    mask = object() if masked else None
    assert _diffusers_attention.prefers_ours(query, key, mask) is ours
    assert _diffusers_attention.prefers_ours(torch.zeros(1, tokens, 1, head_dim, dtype=dtype),
                                             torch.zeros(1, keys, 1, head_dim, dtype=dtype), mask) is False  # CPU


def _families():
    from test_diffusers_dit import dit_kwargs, pixart_kwargs, tiny_dit, tiny_pixart
    from test_diffusers_flux import flux_kwargs, tiny_flux
    from test_diffusers_ltx2 import inputs as ltx2_kwargs
    from test_diffusers_ltx2 import tiny_ltx2
    from test_diffusers_sd3 import sd3_kwargs, tiny_sd3
    from test_diffusers_wan import tiny_wan, wan_kwargs

    return {
        "ltx_video": (lambda: tiny_model("cpu").requires_grad_(False),
                      lambda m: step_kwargs(m, "interpolation_scale", per_token=False)),
        "ltx2": (tiny_ltx2, lambda m: ltx2_kwargs()),
        "flux": (tiny_flux, lambda m: flux_kwargs()),
        "sd3.5": (lambda: tiny_sd3(dual=True), lambda m: sd3_kwargs()),
        "wan": (tiny_wan, lambda m: wan_kwargs()),
        "pixart": (tiny_pixart, lambda m: pixart_kwargs()),
        "dit": (tiny_dit, lambda m: dit_kwargs()),
    }


FAMILIES = ["ltx_video", "ltx2", "flux", "sd3.5", "wan", "pixart", "dit"]


def _first_output(out):
    return (out.sample if hasattr(out, "sample") else out[0]).float()


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_routes_its_attention_by_one_rule(monkeypatch, family):
    """Every integrated family's processors take ltx_kernels.attention by the one rule
    (_diffusers_attention.processor_attention): on the CPU prefers_ours is False and none does;
    with it forced true, every attention of our processors runs the op (one call each) and the
    output is the SDPA-routed one's within fp32's bound (the op: fp64 inside, one rounding); a
    backend chosen with diffusers' API (the model's set_attention_backend("native")) takes the
    dispatcher again."""
    build, kwargs = _families()[family]
    model = build()
    kw = kwargs(model)
    inject_quietly(model)
    ours = sum(1 for _, m in _diffusers_attention._attention_modules(model)
               if type(m.processor).__module__.startswith("ltx_kernels."))
    assert ours > 0
    calls = []
    attention = ltx_kernels.ops.attention
    monkeypatch.setattr(ltx_kernels.ops, "attention", lambda *a, **k: calls.append(1) or attention(*a, **k))
    expected = _first_output(model(**kw))
    assert calls == []
    monkeypatch.setattr(_diffusers_attention, "prefers_ours", lambda query, key, attn_mask: True)
    assert_close(_first_output(model(**kw)), expected, torch.float32)
    assert len(calls) == ours
    calls.clear()
    model.set_attention_backend("native")
    model(**kw)
    assert calls == []


def test_sm90a_kernels_flag_is_the_build():
    """ltx_kernels.ops.SM90A_KERNELS (what the LTX processor routes self-attention by) is
    False in a build without CUDA; with CUDA on an sm_90 GPU, True exactly when ops.attention
    runs the Hopper kernel (attention_sm90_kernel in the profile)."""
    flag = ltx_kernels.ops.SM90A_KERNELS
    assert isinstance(flag, bool)
    if not torch._C._dispatch_has_kernel_for_dispatch_key("ltx_kernels::attention", "CUDA"):
        assert not flag
    if not HAS_CUDA or torch.cuda.get_device_capability()[0] != 9:
        return
    q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        ltx_kernels.ops.attention(q, q, q)
        torch.cuda.synchronize()
    assert any("attention_sm90_kernel" in e.name for e in prof.events()) == flag

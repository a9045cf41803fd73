"""ltx_kernels.layers: forward replacements for HF modules, under the `kernels` layer rules."""

import inspect
import types

import pytest
import torch
from torch import nn

from conftest import DEVICES, DTYPES, assert_close
import ltx_kernels
from ltx_kernels import layers
from test_rms_norm import rms_norm_formula

transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")
from diffusers.models.activations import GELU as DiffusersGELU  # noqa: E402
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm  # noqa: E402
from transformers.activations import GELUTanh  # noqa: E402
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

D = 111  # odd hidden size

# (layer, a function building the stock module it replaces for hidden size D)
REPLACES = {
    layers.RMSNorm: lambda: LlamaRMSNorm(D, eps=1e-5),
    layers.GemmaRMSNorm: lambda: GemmaRMSNorm(D, eps=1e-6),
    layers.DiffusersRMSNorm: lambda: DiffusersRMSNorm(D, eps=1e-6),
    layers.GeluTanh: lambda: GELUTanh(),
    layers.LinearGeluTanh: lambda: DiffusersGELU(D, 2 * D, approximate="tanh"),
}
GATED = {
    layers.SiluAndMul: lambda g, u: torch.nn.functional.silu(g) * u,
    layers.GeluAndMul: lambda g, u: torch.nn.functional.gelu(g) * u,
    layers.GeluTanhAndMul: lambda g, u: torch.nn.functional.gelu(g, approximate="tanh") * u,
}
ALL_LAYERS = [*REPLACES, *GATED]


def swapped(module: nn.Module, layer: type) -> nn.Module:
    """``module`` with its forward replaced by ``layer.forward``, as ``kernelize`` does."""
    module.forward = types.MethodType(layer.forward, module)
    return module


def random_stock(layer: type, device, dtype) -> nn.Module:
    """A stock module with random parameters, frozen (the forward is under test here; the
    layers' gradients are those of their ops, tests/python/test_backward.py)."""
    module = REPLACES[layer]().to(device=device, dtype=dtype).requires_grad_(False)
    for p in module.parameters():
        p.normal_()
    return module


@pytest.mark.parametrize("layer", ALL_LAYERS, ids=lambda c: c.__name__)
def test_follows_the_kernels_layer_rules(layer):
    """No constructor, no members beyond the two flags, the replaced forward's signature."""
    assert issubclass(layer, nn.Module) and layer.__init__ is nn.Module.__init__
    members = {name for name, _ in inspect.getmembers(layer)} - {name for name, _ in inspect.getmembers(nn.Module)}
    assert members == {"can_torch_compile", "has_backward"}
    assert layer.can_torch_compile is True and layer.has_backward is True
    if layer in REPLACES:
        ours = inspect.signature(layer.forward).parameters.values()
        stock = inspect.signature(type(REPLACES[layer]()).forward).parameters.values()
        assert [p.kind for p in ours] == [p.kind for p in stock]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_match_the_formula(device, dtype):
    x = torch.randn(3, 5, D, device=device, dtype=dtype)
    llama = random_stock(layers.RMSNorm, device, dtype)
    assert_close(swapped(llama, layers.RMSNorm)(x), rms_norm_formula(x, llama.weight, 1e-5), dtype)
    gemma = random_stock(layers.GemmaRMSNorm, device, dtype)
    expected = rms_norm_formula(x.double(), 1 + gemma.weight.double(), 1e-6)
    assert_close(swapped(gemma, layers.GemmaRMSNorm)(x), expected, dtype)
    plain = random_stock(layers.DiffusersRMSNorm, device, dtype)
    assert_close(swapped(plain, layers.DiffusersRMSNorm)(x), rms_norm_formula(x, plain.weight, 1e-6), dtype)
    no_weight = DiffusersRMSNorm(D, eps=1e-6, elementwise_affine=False)
    assert_close(swapped(no_weight, layers.DiffusersRMSNorm)(x), rms_norm_formula(x, None, 1e-6), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_diffusers_rms_norm_with_bias(device):
    module = DiffusersRMSNorm(D, eps=1e-6, bias=True).to(device).requires_grad_(False)
    module.weight.normal_()
    module.bias.normal_()
    x = torch.randn(4, D, device=device)
    expected = rms_norm_formula(x, module.weight, 1e-6) + module.bias
    assert_close(swapped(module, layers.DiffusersRMSNorm)(x), expected, torch.float32)


# The RMS norm kinds: the stock module for hidden size D, the layer whose forward replaces it,
# and its weight offset (Gemma's 1 + weight).
RMS_NORM_KINDS = {
    "llama": (lambda: LlamaRMSNorm(D, eps=1e-5), layers.RMSNorm, 0.0),
    "gemma": (lambda: GemmaRMSNorm(D, eps=1e-6), layers.GemmaRMSNorm, 1.0),
    "diffusers": (lambda: DiffusersRMSNorm(D, eps=1e-6), layers.DiffusersRMSNorm, 0.0),
    "torch": (lambda: nn.RMSNorm(D, eps=1e-6), layers.RMSNorm, 0.0),  # as inject patches it
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", RMS_NORM_KINDS)
@pytest.mark.parametrize("weight_dtype, x_dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                                   (torch.bfloat16, torch.float32), (torch.bfloat16, torch.float16)])
def test_norm_mixed_dtypes_run_our_kernel_in_the_stock_dtype(kind, weight_dtype, x_dtype, device, monkeypatch):
    """A weight in another dtype than the input (kept in fp32 under a 16-bit model, ...): our
    kernel runs, never the stock forward, and returns the stock forward's dtype with values
    as close to the fp64 formula as that dtype allows."""
    build, layer, offset = RMS_NORM_KINDS[kind]
    stock = build().to(device=device, dtype=weight_dtype).requires_grad_(False)
    stock.weight.normal_()
    x = torch.randn(6, D, device=device, dtype=x_dtype)
    expected_dtype = stock(x).dtype

    def no_fallback(*args, **kwargs):
        raise AssertionError("the stock forward ran")

    calls = []
    kernel = ltx_kernels.ops.rms_norm
    monkeypatch.setattr(type(stock), "forward", no_fallback)
    monkeypatch.setattr(ltx_kernels.ops, "rms_norm", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    out = types.MethodType(layer.forward, stock)(x)
    assert calls == [1]
    assert out.dtype == expected_dtype
    assert_close(out, rms_norm_formula(x, stock.weight, stock.eps if kind != "llama" else 1e-5, offset), out.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weight_dtype, x_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16)])
def test_layer_norm_mixed_dtypes_run_our_kernel(weight_dtype, x_dtype, device, monkeypatch):
    """torch.nn.LayerNorm as transformers.apply patches it (Falcon): x's dtype out, as stock."""
    from ltx_kernels._forwards import layer_norm_forward
    from test_layer_norm import layer_norm_formula

    stock = nn.LayerNorm(D).to(device=device, dtype=weight_dtype).requires_grad_(False)
    stock.weight.normal_()
    stock.bias.normal_()
    x = torch.randn(6, D, device=device, dtype=x_dtype)
    monkeypatch.setattr(nn.LayerNorm, "forward", lambda *a: pytest.fail("the stock forward ran"))
    out = layer_norm_forward(stock, x)
    assert out.dtype == x_dtype
    assert_close(out, layer_norm_formula(x, stock.weight, stock.bias, stock.eps), x_dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activations_match_torch(device, dtype):
    x = torch.randn(4, 2 * D, device=device, dtype=dtype)
    for layer, formula in GATED.items():
        gate, up = x.double().chunk(2, dim=-1)
        assert_close(layer()(x), formula(gate, up), dtype)
    assert_close(swapped(GELUTanh(), layers.GeluTanh)(x), torch.nn.functional.gelu(x.double(), approximate="tanh"), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gelu_tanh_matches_diffusers_gelu(device, dtype):
    stock = random_stock(layers.LinearGeluTanh, device, dtype)
    x = torch.randn(5, D, device=device, dtype=dtype)
    expected = torch.nn.functional.gelu(
        x.double() @ stock.proj.weight.double().T + stock.proj.bias.double(), approximate="tanh"
    )
    # The GEMM accumulates in fp32 over D terms: a second rounding's worth of slack.
    assert_close(swapped(stock, layers.LinearGeluTanh)(x), expected, dtype, scale=2.0)


@pytest.mark.parametrize("device", DEVICES)
def test_layers_compile_fullgraph(device):
    norm = swapped(random_stock(layers.RMSNorm, device, torch.float32), layers.RMSNorm)
    act = layers.SiluAndMul()
    x = torch.randn(3, 2 * D, device=device)

    def f(x):
        return norm(act(x))

    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    with torch.no_grad():
        assert_close(torch.compile(f, fullgraph=True, backend=backend)(x), f(x), torch.float32)


def test_missing_epsilon_is_named():
    module = nn.Module()
    module.weight = nn.Parameter(torch.ones(D))
    with pytest.raises(AttributeError, match="neither `variance_epsilon` nor `eps`"):
        layers.RMSNorm.forward(module, torch.randn(2, D))


def test_integrations_and_layers_patch_each_module_kind_with_one_forward():
    """diffusers' RMSNorm (inject), transformers' RMSNorm (apply) and the hub layers run the
    same function, and so do diffusers' GELU-tanh and the LinearGeluTanh layer."""
    import warnings

    import ltx_kernels.diffusers as lkd
    import ltx_kernels.transformers as lt
    from test_transformers_integration import tiny_model

    diffusers_modules = nn.ModuleList([DiffusersRMSNorm(D, eps=1e-6), DiffusersGELU(D, 2 * D, approximate="tanh")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lkd.inject(diffusers_modules)
        llama = tiny_model("llama")
        lt.apply(llama)
        gemma = tiny_model("gemma")
        lt.apply(gemma)
    diffusers_norm, gelu = diffusers_modules
    assert diffusers_norm.forward.__func__ is llama.model.norm.forward.__func__ is layers.RMSNorm.forward
    assert layers.DiffusersRMSNorm.forward is layers.RMSNorm.forward
    assert gemma.model.norm.forward.__func__ is layers.GemmaRMSNorm.forward
    assert gelu.forward.__func__ is layers.LinearGeluTanh.forward


@pytest.mark.parametrize("layer", [layers.RMSNorm, layers.DiffusersRMSNorm], ids=lambda c: c.__name__)
def test_norm_reads_eps_at_call_time(layer):
    stock = random_stock(layer, "cpu", torch.float32)
    swapped(stock, layer)
    x = torch.randn(4, D)
    name = "variance_epsilon" if hasattr(stock, "variance_epsilon") else "eps"
    setattr(stock, name, 0.5)
    assert_close(stock(x), rms_norm_formula(x, stock.weight, 0.5), torch.float32)


@pytest.mark.parametrize("kind", RMS_NORM_KINDS)
def test_norm_mixed_dtypes_compile_fullgraph(kind):
    """The mixed-precision forward (stock output dtype, widened weights) traces without graph
    breaks."""
    build, layer, _ = RMS_NORM_KINDS[kind]
    module = build().requires_grad_(False)
    module.weight.normal_()
    norm = types.MethodType(layer.forward, module)
    x = torch.randn(4, D, dtype=torch.bfloat16)
    torch._dynamo.reset()
    out = torch.compile(norm, fullgraph=True, backend="aot_eager")(x)
    assert out.dtype == norm(x).dtype
    torch.testing.assert_close(out, norm(x))

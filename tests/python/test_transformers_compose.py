"""ltx_kernels.transformers.apply composed with what transformers users turn on, in either
order: peft LoRA adapters (transformers' ``add_adapter`` / ``load_adapter`` and peft's
``get_peft_model``, with the steps users take after), accelerate's offload hooks as
``device_map`` / ``dispatch_model`` / ``cpu_offload`` install them, and a static cache with
``torch.compile`` in ``generate``; and the FP8 combinations that cannot work, which raise.

Each case compares the patched tiny fp32 model with the stock model with the same feature,
element by element (``conftest.assert_close``: fp32 rounding; a dropped adapter, a weight
read from the meta device or a skipped hook is off by far more), and proves the feature is
active and our kernels ran.
"""

import copy
import warnings
from collections import Counter

import pytest
import torch

from conftest import DEVICES, assert_close

pytest.importorskip("transformers")
import ltx_kernels.transformers as lt  # noqa: E402
from test_transformers_integration import SIZES, logits, prompt, rel, tiny_model  # noqa: E402

LAYERS = SIZES["num_hidden_layers"]
PATCHED = 13  # llama: 5 norms, 2 x (decoder layer, attention, MLP), the decoder stack, the head's loss


def apply_quietly(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft models are in train mode: the report notes it
        return lt.apply(model, **kwargs)


def check_patched_against_stock(model, stock, ids, mask):
    """Patched logits against stock's with the same feature; returns stock's."""
    expected, out = logits(stock, ids, mask), logits(model, ids, mask)
    assert_close(out, expected, torch.float32)
    assert not torch.equal(out, expected), "our kernels did not run"
    return expected


# --- peft LoRA -----------------------------------------------------------------------------
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _randomize_lora(model, seed=1):
    """LoRA matrices drawn from their own generator: the same in any order of adding them and
    apply; peft's default init makes B zero (an adapter that changes nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def _configs():
    from peft import LoraConfig

    # "a" on every linear of the layers, "b" on two of the MLP's, twice the scale.
    return (LoraConfig(r=4, lora_alpha=4, target_modules=TARGETS),
            LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "down_proj"]))


def _add_adapter(model, tmp_path):
    """transformers' PeftAdapterMixin: two adapters, both active."""
    a, b = _configs()
    model.add_adapter(a, "a")
    model.add_adapter(b, "b")
    _randomize_lora(model)
    model.set_adapter(["a", "b"])
    return model


def _load_adapter(model, tmp_path):
    """transformers' load_adapter of an adapter saved by peft (a downloaded LoRA)."""
    from peft import get_peft_model

    path = tmp_path / "adapter"
    if not path.exists():
        donor = get_peft_model(tiny_model("llama"), _configs()[1], adapter_name="b")
        _randomize_lora(donor)
        donor.save_pretrained(path)  # saved as .../b (the adapter's name)
    model.load_adapter(str(path / "b"), adapter_name="b")
    return model


def _get_peft_model(model, tmp_path):
    """peft's own wrapper: the model is a PeftModel from here on."""
    from peft import get_peft_model

    peft_model = get_peft_model(model, _configs()[1], adapter_name="b")
    _randomize_lora(peft_model)
    return peft_model.eval()


LORA_APIS = {"add_adapter": _add_adapter, "load_adapter": _load_adapter, "get_peft_model": _get_peft_model}

# Steps a LoRA user takes after loading adapters, applied in turn to stock and patched; each
# either changes the output or (merging) is checked by its own mark.
LORA_STEPS = {
    "set_adapter_b": lambda m: m.set_adapter("b"),
    "disable_adapters": lambda m: m.disable_adapters(),
    "enable_adapters": lambda m: m.enable_adapters(),
    "delete_adapter_a": lambda m: m.delete_adapter("a"),
    "merge_adapter": lambda m: m.merge_adapter(),
    "unmerge_adapter": lambda m: m.unmerge_adapter(),
    "merge_and_unload": lambda m: m.merge_and_unload(),
}
MERGING = {"merge_adapter": True, "unmerge_adapter": False, "merge_and_unload": None}
LORA_CASES = [
    ("add_adapter", ["set_adapter_b"]),
    ("add_adapter", ["disable_adapters", "enable_adapters"]),
    ("add_adapter", ["delete_adapter_a"]),
    ("load_adapter", []),
    ("get_peft_model", ["merge_adapter", "unmerge_adapter"]),
    ("get_peft_model", ["merge_and_unload"]),
]


def _down_proj(model):
    return model.get_base_model().model.layers[0].mlp.down_proj if hasattr(model, "get_base_model") \
        else model.model.layers[0].mlp.down_proj


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`")
@pytest.mark.parametrize("order", ["lora_then_apply", "apply_then_lora"])
@pytest.mark.parametrize("api,steps", LORA_CASES, ids=["-".join([c[0], *c[1]]) for c in LORA_CASES])
@torch.no_grad()
def test_peft_lora(api, steps, order, tmp_path):
    pytest.importorskip("peft")
    base = tiny_model("llama")
    ids, mask = prompt()
    stock = LORA_APIS[api](copy.deepcopy(base), tmp_path)
    assert rel(logits(stock, ids, mask), logits(base, ids, mask), mask) > 1e-2, "the adapters do nothing"

    model = copy.deepcopy(base)
    if order == "apply_then_lora":
        report = apply_quietly(model)
    model = LORA_APIS[api](model, tmp_path)
    if order == "lora_then_apply":
        report = apply_quietly(model)
    assert sum(report.patched.values()) == PATCHED and not report.skipped, report

    outputs = [check_patched_against_stock(model, stock, ids, mask)]
    for name in steps:
        stock, model = LORA_STEPS[name](stock) or stock, LORA_STEPS[name](model) or model
        outputs.append(check_patched_against_stock(model, stock, ids, mask))
        merged = MERGING.get(name, "changes")
        if merged == "changes":
            assert rel(outputs[-1], outputs[-2], mask) > 1e-2, f"{name} changed nothing"
        elif merged is None:  # unloaded: plain linears with the adapters merged in
            assert type(_down_proj(model)) is torch.nn.Linear
        else:
            assert _down_proj(model).merged == merged
    assert lt.remove(model) == PATCHED
    assert torch.equal(logits(model, ids, mask), logits(stock, ids, mask))


# --- accelerate offload hooks --------------------------------------------------------------
# Where the offloaded weights live between calls: beside the execution device, the CPU for a
# GPU, the disk for the CPU (accelerate hooks nothing for CPU modules run on the CPU).
def _offload_target(device):
    return "cpu" if device == "cuda" else "disk"


def _main(device):
    return 0 if device == "cuda" else "cpu"


def _cpu_offload(model, device, tmp_path):
    """accelerate.cpu_offload: every weight on the meta device, loaded by its module's hook
    (what diffusers' enable_sequential_cpu_offload installs)."""
    from accelerate import cpu_offload

    return cpu_offload(model, execution_device=torch.device(device))


def _dispatch_model(model, device, tmp_path):
    """accelerate.dispatch_model with a device_map that offloads the second decoder layer (the
    hooks from_pretrained(device_map=...) installs)."""
    from accelerate import dispatch_model

    main = _main(device)
    device_map = {name: main for name in ("model.embed_tokens", "model.layers.0", "model.norm",
                                          "model.rotary_emb", "lm_head")}
    device_map["model.layers.1"] = _offload_target(device)
    return dispatch_model(model, device_map=device_map, main_device=main, offload_dir=str(tmp_path / "offload"))


def _from_pretrained_device_map_auto(model, device, tmp_path):
    """from_pretrained(device_map="auto") with too little memory on the execution device: the
    model is loaded with its layers offloaded."""
    from transformers import AutoModelForCausalLM

    path = tmp_path / "checkpoint"
    if not path.exists():
        model.save_pretrained(path)
    # 674 kB of fp32 weights: on the GPU the embeddings and layers.0 fit, on the CPU nothing does.
    max_memory = {0: 600_000, "cpu": 2**30} if device == "cuda" else {"cpu": 150_000}
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map="auto", max_memory=max_memory,
                                                  offload_folder=str(tmp_path / "offload"))
    assert _offload_target(device) in loaded.hf_device_map.values(), loaded.hf_device_map
    return loaded.eval()


OFFLOADS = {"cpu_offload": _cpu_offload, "dispatch_model": _dispatch_model,
            "from_pretrained_device_map_auto": _from_pretrained_device_map_auto}
OFFLOAD_CASES = [("cpu_offload", "offload_then_apply"), ("cpu_offload", "apply_then_offload"),
                 ("dispatch_model", "offload_then_apply"), ("dispatch_model", "apply_then_offload"),
                 ("from_pretrained_device_map_auto", "offload_then_apply")]  # a checkpoint loads stock


@pytest.fixture
def fused_norm_calls(monkeypatch):
    """Counts fused_add_rms_norm calls (the decoder layer's residual + post-attention norm,
    which reads the norm's weight in place: between the norm's hooks)."""
    calls = Counter()
    fused = lt.ops.fused_add_rms_norm

    def counted(*args, **kwargs):
        calls["fused_add_rms_norm"] += 1
        return fused(*args, **kwargs)

    monkeypatch.setattr(lt.ops, "fused_add_rms_norm", counted)
    return calls


@pytest.mark.filterwarnings("ignore:You are calling .generate\\(\\) with the `input_ids` being on a device")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offload,order", OFFLOAD_CASES, ids=["-".join(c) for c in OFFLOAD_CASES])
@torch.no_grad()
def test_accelerate_offload(offload, order, device, tmp_path, fused_norm_calls):
    pytest.importorskip("accelerate")
    base = tiny_model("llama")
    ids, mask = prompt(device=device)
    stock = OFFLOADS[offload](copy.deepcopy(base), device, tmp_path)
    offloaded = stock.model.layers[1].post_attention_layernorm.weight
    assert offloaded.device.type == "meta", "nothing is offloaded: the test would prove nothing"

    model = copy.deepcopy(base)
    if order == "apply_then_offload":
        report = lt.apply(model)
    model = OFFLOADS[offload](model, device, tmp_path)
    if order == "offload_then_apply":
        report = lt.apply(model)
    assert sum(report.patched.values()) == PATCHED and not report.skipped, report

    fused_norm_calls.clear()
    expected = check_patched_against_stock(model, stock, ids, mask)
    assert fused_norm_calls["fused_add_rms_norm"] == LAYERS  # fused, with the weight loaded by its hook
    assert model.model.layers[1].post_attention_layernorm.weight.device.type == "meta"  # offloaded again
    kwargs = dict(attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kwargs), stock.generate(ids, **kwargs))
    assert lt.remove(model) == PATCHED
    assert torch.equal(logits(model, ids, mask), expected)


# --- static cache + torch.compile in generate ----------------------------------------------
def _compile_config(device, graphs):
    """generate's compile config, fullgraph (any graph break raises), on the CPU too, with a
    backend that records each graph's ops before handing it to aot_eager (inductor on CUDA)."""
    from transformers import CompileConfig

    inner = torch._dynamo.lookup_backend("inductor" if device == "cuda" else "aot_eager")

    def recording(gm, example_inputs):
        graphs.append({str(node.target) for node in gm.graph.nodes if node.op == "call_function"})
        return inner(gm, example_inputs)

    config = CompileConfig(backend=recording, fullgraph=True, mode=None)
    config._compile_all_devices = True  # transformers compiles on accelerators only by default
    return config


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
@torch.no_grad()
def test_static_cache_compiled_generate(model_type, device):
    """Greedy tokens of the patched model through generate's compiled decode steps equal
    stock's through the same; the compiled graphs hold our ops."""
    base = tiny_model(model_type).to(device)
    ids, mask = prompt(device=device)
    kwargs = dict(attention_mask=mask, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0,
                  cache_implementation="static")
    runs = {}
    for patched in (False, True):
        torch._dynamo.reset()
        model, graphs = copy.deepcopy(base), []
        if patched:
            lt.apply(model)
        runs[patched] = model.generate(ids, compile_config=_compile_config(device, graphs), **kwargs)
        assert graphs and hasattr(model, "_compiled_call"), "generate did not compile"
        ours = {op for graph in graphs for op in graph if "ltx_kernels" in op}
        assert bool(ours) == patched, ours
    assert torch.equal(runs[True], runs[False])
    assert torch.equal(runs[False], base.generate(ids, **kwargs)), "compiled stock differs from eager stock"


# --- FP8 combinations ----------------------------------------------------------------------
def fp8_model():
    return tiny_model("llama", intermediate_size=128)  # features multiples of 16


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`")
@pytest.mark.parametrize("api", ["add_adapter", "get_peft_model"])
@torch.no_grad()
def test_lora_after_fp8_raises_naming_both(api, tmp_path):
    """peft casts LoRA matrices to the base weight's dtype: on e4m3 weights they cannot run,
    so the forward says so instead of failing inside peft (add adapters before FP8)."""
    pytest.importorskip("peft")
    model = fp8_model()
    apply_quietly(model, precision="fp8")
    model = LORA_APIS[api](model, tmp_path)
    with pytest.raises(RuntimeError, match=r"peft adapter layer .* precision='fp8'.* before patching"):
        logits(model, *prompt())


@torch.no_grad()
def test_fp8_and_accelerate_offload():
    """FP8 then offload: the quantized weights are what accelerate offloads (same logits as
    FP8 without offload). Offload then FP8 raises before touching the model: accelerate would
    reload the original weights for each forward."""
    pytest.importorskip("accelerate")
    from accelerate import cpu_offload

    ids, mask = prompt()
    fp8 = fp8_model()
    apply_quietly(fp8, precision="fp8")
    expected = logits(fp8, ids, mask)
    offloaded = cpu_offload(copy.deepcopy(fp8), execution_device=torch.device("cpu"))
    assert offloaded.model.layers[0].mlp.up_proj.weight.device.type == "meta"
    assert torch.equal(logits(offloaded, ids, mask), expected)

    model = cpu_offload(fp8_model(), execution_device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"precision='fp8' cannot quantize .* meta device: .* offloaded by accelerate"):
        lt.apply(model, precision="fp8")
    assert not any("_ltx_kernels_patch" in m.__dict__ for m in model.modules())



@torch.no_grad()
def test_lora_then_fp8(tmp_path):
    """Adapters added before FP8 (on gate and down): the linears inside them stay in the
    model's dtype (reported), the others go FP8, and the adapters still apply."""
    pytest.importorskip("peft")
    from ltx_kernels import _fp8
    from test_transformers_fp8 import FP8_ERROR_BOUND

    ids, mask = prompt()
    stock = _get_peft_model(fp8_model(), tmp_path)
    without_lora = fp8_model()
    apply_quietly(without_lora, precision="fp8")
    model = _get_peft_model(fp8_model(), tmp_path)
    report = apply_quietly(model, precision="fp8")
    mlp = model.get_base_model().model.layers[0].mlp
    assert not _fp8.is_quantized(mlp.gate_proj.base_layer) and _fp8.is_quantized(mlp.up_proj)
    assert sum("inside the peft adapter layer" in reason for reason in report.skipped) == 2 * LAYERS  # gate, down
    out, expected = logits(model, ids, mask), logits(stock, ids, mask)
    assert rel(out, expected, mask) < rel(logits(without_lora, ids, mask), expected, mask)  # adapters apply
    assert 0 < rel(out, expected, mask) <= FP8_ERROR_BOUND

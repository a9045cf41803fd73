"""transformers.apply(model, precision="fp8") on tiny random LLMs: which linears go FP8,
accuracy against the fp32 model, shared quantizations, one-way semantics."""

import copy
import types
import warnings

import pytest
import torch

from conftest import DEVICES

pytest.importorskip("transformers")
import ltx_kernels.transformers as lt  # noqa: E402
from ltx_kernels import _fp8  # noqa: E402
from test_fp8 import count_quantizations, torch_quantize  # noqa: E402
from test_transformers_integration import FAMILIES, SIZES, logits, prompt, rel, tiny_model  # noqa: E402

# Quantized linears per layer where not 7 (q/k/v/o and gate/up/down): Phi-3 fuses q/k/v and
# gate/up into one projection each. The head stays in the model's dtype.
LINEARS_PER_LAYER = {"phi3": 4}
# Ours against the stock model with the same FP8 rounding emulated in plain torch: the rest
# of the model differs by fp32 rounding (fused norms, RoPE, GLU), which moves a few values
# across an e4m3 rounding boundary (measured up to 4.5e-4 on the CPU).
EMULATION_TOLERANCE = 3e-3
# FP8 itself against fp32: 3 mantissa bits on these tiny random models' sensitive logits give
# ~1e-1 (measured 0.096 to 0.123, the same with the emulation): a sanity bound only.
FP8_ERROR_BOUND = 0.2


def _emulated_forward(self, x):
    """The linear with both operands rounded to e4m3 by torch_quantize. On CUDA the product of
    the e4m3 operands is the tensor cores' (``torch._scaled_mm``, unit scales): their FP8
    accumulator is not fp32 (~1e-3 of the rms at K = 256, see test_fp8), and on these
    sensitive models that difference, re-rounded to e4m3 by the next layer's quantization,
    grows to ~4e-2 of the logits; the emulation must accumulate as the hardware does to
    isolate what it checks: which tensors are quantized, with which scales."""
    (xq, xs), (wq, ws) = torch_quantize(x.reshape(-1, x.shape[-1])), torch_quantize(self.weight)
    if x.is_cuda:
        one = torch.ones((), device=x.device)
        acc = torch._scaled_mm(xq, wq.t(), one, one, out_dtype=torch.float32)
    else:
        acc = xq.float() @ wq.float().t()
    out = acc * xs[:, None] * ws[None, :]
    if self.bias is not None:
        out = out + self.bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], -1)


def emulated_fp8(model):
    """A copy of stock ``model`` whose linears but the head round like FP8, in plain torch."""
    model = copy.deepcopy(model)
    for name, m in model.named_modules():
        if type(m) is torch.nn.Linear and name != "lm_head":
            m.forward = types.MethodType(_emulated_forward, m)
    return model


def apply_quietly(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lt.apply(model, **kwargs)


def fp8_model(model_type, device="cpu"):
    return tiny_model(model_type, intermediate_size=128).to(device)  # features multiples of 16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_fp8_logits_match_the_emulated_format(model_type, device):
    model = fp8_model(model_type, device)
    ids, mask = prompt(device=device)
    reference, emulated = logits(model, ids, mask), logits(emulated_fp8(model), ids, mask)
    report = apply_quietly(model, precision="fp8")
    assert report.patched[_fp8.KIND] == LINEARS_PER_LAYER.get(model_type, 7) * SIZES["num_hidden_layers"]
    assert not _fp8.is_quantized(model.lm_head)
    out = logits(model, ids, mask)
    assert rel(out, emulated, mask) <= EMULATION_TOLERANCE
    assert 0 < rel(out, reference, mask) <= FP8_ERROR_BOUND


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fp8_quantizes_shared_inputs_once(monkeypatch, family):
    """Per layer: q/k/v share one quantization, written by input_layernorm itself; gate/up one,
    written by the fused residual + post-attention norm; o and down one standalone pass each:
    4, not 7."""
    model = fp8_model(family)
    apply_quietly(model, precision="fp8")
    calls = count_quantizations(monkeypatch)
    logits(model, *prompt())
    layers = SIZES["num_hidden_layers"]
    assert len(calls) == 4 * layers
    assert calls.count("rms_norm_fp8") == calls.count("fused_add_rms_norm_fp8") == layers


@pytest.mark.parametrize("target", ["input_layernorm", "post_attention_layernorm", "self_attn", "self_attn.k_proj",
                                    "mlp", "mlp.up_proj"])
def test_fp8_hooks_on_producers_and_consumers_of_a_quantized_norm_output_run(target):
    """The norms write their outputs quantized only while every consumer is one of our FP8
    linears, unhooked: a hook on the norm, the attention, a projection or the MLP sees its call
    and the logits stay as close to the emulated format."""
    model = fp8_model("llama")
    apply_quietly(model, precision="fp8")
    ids, mask = prompt()
    fused = logits(model, ids, mask)
    seen = []
    model.model.layers[0].get_submodule(target).register_forward_hook(lambda m, i, o: seen.append(m))
    hooked = logits(model, ids, mask)
    assert seen and rel(hooked, fused, mask) < 1e-2


def test_fp8_one_way_and_no_mixing():
    model = fp8_model("qwen2")
    with pytest.raises(ValueError, match="apply: precision must be 'bf16' or 'fp8'"):
        lt.apply(model, precision="fp16")
    apply_quietly(model)
    with pytest.raises(ValueError, match="already patched with precision='bf16'"):
        lt.apply(model, precision="fp8")
    lt.remove(model)
    apply_quietly(model, precision="fp8")
    with pytest.raises(RuntimeError, match="one-way"):
        lt.remove(model)
    with pytest.raises(ValueError, match="was patched with precision='fp8'"):
        lt.apply(model)
    assert sum(apply_quietly(model, precision="fp8").patched.values()) == 0


def test_fp8_generate_runs():
    model = fp8_model("llama")
    apply_quietly(model, precision="fp8")
    ids, mask = prompt()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    assert out.shape == (2, ids.shape[1] + 5)

"""inject() / apply() where a user's setup is unusual (issue 19, item 5): a model built on the
meta device (weights loaded later), fp16, and a failed call (FP8 on weights that are not
there), after which the model is as it was and remove() works."""

import copy

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

import ltx_kernels.diffusers as lkd  # noqa: E402
import ltx_kernels.transformers as lkt  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from test_diffusers_ltx import step_kwargs  # noqa: E402
from test_diffusers_ltx import tiny_model as tiny_ltx  # noqa: E402
from test_transformers_integration import prompt  # noqa: E402
from test_transformers_integration import tiny_model as tiny_llm  # noqa: E402


def on_meta(model):
    """An empty copy of ``model`` built on the meta device (as init_empty_weights gives)."""
    with torch.device("meta"):
        return type(model)(**model.config) if hasattr(model.config, "items") else type(model)(model.config)


def load_from(empty, real):
    """``empty`` (a meta model) on the CPU with ``real``'s parameters and buffers (the
    non-persistent ones too, e.g. RoPE's inv_freq, which no state dict carries)."""
    empty = empty.to_empty(device="cpu")
    empty.load_state_dict(real.state_dict())
    with torch.no_grad():
        for name, buffer in real.named_buffers():
            empty.get_buffer(name).copy_(buffer)
    return empty


def patched_modules(model):
    return [name for name, m in model.named_modules() if is_patched(m)]


def test_inject_on_meta_then_load_weights_runs_as_on_a_real_model():
    real = tiny_ltx("cpu")
    empty = on_meta(real)
    report = lkd.inject(empty)
    assert report.patched
    empty = load_from(empty, real)
    lkd.inject(real)
    kw = step_kwargs(real, "video_coords", per_token=False)
    with torch.no_grad():
        torch.testing.assert_close(empty(**kw)[0], real(**kw)[0], rtol=0, atol=0)


def test_apply_on_meta_then_load_weights_runs_as_on_a_real_model():
    real = tiny_llm("llama")
    empty = on_meta(real)
    lkt.apply(empty)
    assert patched_modules(empty)
    empty = load_from(empty, real)
    lkt.apply(real)
    ids, mask = prompt()
    with torch.no_grad():
        torch.testing.assert_close(empty(input_ids=ids, attention_mask=mask).logits,
                                   real(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=0)


@pytest.mark.parametrize("api", ["inject", "apply"])
def test_failed_fp8_call_leaves_the_model_as_it_was(api):
    """FP8 needs the weights: on a meta model the call raises naming why, patches nothing,
    and remove() afterwards is a no-op; the model then loads and runs stock."""
    real = tiny_ltx("cpu") if api == "inject" else tiny_llm("llama")
    empty = on_meta(real)
    call, remove = (lkd.inject, lkd.remove) if api == "inject" else (lkt.apply, lkt.remove)
    forwards = {name: m.forward for name, m in empty.named_modules()}
    with pytest.raises(ValueError, match=r"precision='fp8' cannot quantize .* meta device"):
        call(empty, precision="fp8")
    assert patched_modules(empty) == []
    assert all(m.forward == forwards[name] for name, m in empty.named_modules())
    remove(empty)
    assert patched_modules(empty) == []


@pytest.mark.parametrize("api", ["inject", "apply"])
def test_fp16_model(api):
    """fp16 throughout: no worse against the fp32 model than stock fp16."""
    fp32 = tiny_ltx("cpu") if api == "inject" else tiny_llm("llama")
    stock = copy.deepcopy(fp32).half()
    ours = copy.deepcopy(fp32).half()
    (lkd.inject if api == "inject" else lkt.apply)(ours)
    assert patched_modules(ours)

    def run(model, dtype):
        with torch.no_grad():
            if api == "apply":
                ids, mask = prompt()
                return model(input_ids=ids, attention_mask=mask).logits.float()
            kw = step_kwargs(model, "video_coords", per_token=False)  # seeded: the same inputs each call
            kw = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kw.items()}
            return model(**kw)[0].float()

    ref = run(fp32, torch.float32)
    ours_err = ((run(ours, torch.float16) - ref).norm() / ref.norm()).item()
    stock_err = ((run(stock, torch.float16) - ref).norm() / ref.norm()).item()
    assert ours_err <= 1.1 * stock_err, (ours_err, stock_err)

"""transformers.apply on a *ForCausalLM: in train mode with labels the loss comes from
fused_linear_cross_entropy (no logits), equal to stock's in value and gradients; everywhere
else the forward is stock."""

import copy
import warnings

import pytest
import torch

pytest.importorskip("transformers")
import ltx_kernels.transformers as lt  # noqa: E402
from conftest import DEVICES, assert_close  # noqa: E402
from ltx_kernels import _causal_lm_loss  # noqa: E402
from test_transformers_integration import FAMILIES, SIZES, tiny_model  # noqa: E402


def batch(seed=2, length=13):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, SIZES["vocab_size"], (2, length), generator=generator)
    labels = ids.clone()
    labels[1, :4] = -100  # a padded prompt
    return ids, labels


def pair(model_type, device="cpu"):
    stock = tiny_model(model_type).to(device).train()
    patched = copy.deepcopy(stock)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = lt.apply(patched)
    return stock, patched, report


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("num_items", [None, 17])
def test_train_loss_and_gradients_match_stock(device, model_type, num_items):
    stock, patched, report = pair(model_type, device)
    assert report.patched[_causal_lm_loss.KIND] == 1
    ids, labels = (t.to(device) for t in batch())
    kwargs = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    want = stock(input_ids=ids, labels=labels, **kwargs)
    got = patched(input_ids=ids, labels=labels, **kwargs)
    assert got.logits is None and want.logits is not None
    assert_close(got.loss, want.loss, torch.float32, scale=10.0)
    want.loss.backward()
    got.loss.backward()
    for (name, p), q in zip(stock.named_parameters(), patched.parameters()):
        assert q.grad is not None, name
        assert_close(q.grad, p.grad, torch.float32, scale=10.0)


def test_eval_without_labels_and_tuple_outputs_stay_stock():
    stock, patched, _ = pair("llama")
    ids, labels = batch()
    # (the decoder's own patched ops differ from stock in the last bits: close, not equal)
    got = patched(input_ids=ids, labels=labels, return_dict=False)  # (loss, logits, ...)
    assert_close(got[1], stock(input_ids=ids, labels=labels, return_dict=False)[1], torch.float32, scale=10.0)
    assert patched(input_ids=ids).logits is not None
    stock.eval(), patched.eval()
    with torch.no_grad():
        got, want = patched(input_ids=ids, labels=labels), stock(input_ids=ids, labels=labels)
    assert_close(got.logits, want.logits, torch.float32, scale=10.0)
    assert_close(got.loss, want.loss, torch.float32, scale=10.0)


def test_hooked_or_lora_head_keeps_the_stock_loss():
    stock, patched, _ = pair("llama")
    ids, labels = batch()
    calls = []
    patched.lm_head.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    got = patched(input_ids=ids, labels=labels)
    assert calls and got.logits is not None
    assert_close(got.loss, stock(input_ids=ids, labels=labels).loss, torch.float32, scale=10.0)

    peft = pytest.importorskip("peft")
    _, patched, _ = pair("llama")
    patched = peft.get_peft_model(patched, peft.LoraConfig(r=4, target_modules=["lm_head", "q_proj"]))
    assert patched(input_ids=ids, labels=labels).logits is not None  # the LoRA head runs


def test_remove_restores_the_stock_forward():
    _, patched, _ = pair("llama")
    lt.remove(patched)
    ids, labels = batch()
    assert patched(input_ids=ids, labels=labels).logits is not None


def test_models_whose_loss_differs_stay_stock_and_are_reported():
    model = tiny_model("llama").train()
    model.config.final_logit_softcapping = 30.0
    assert _causal_lm_loss.unsupported(model) == "logit soft-capping"
    with pytest.warns(UserWarning, match="loss stays stock \\(logit soft-capping\\)"):
        report = lt.apply(model)
    assert report.patched[_causal_lm_loss.KIND] == 0
    base = tiny_model("llama").model  # a decoder without a head: nothing to say about a loss
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lt.apply(base).patched[_causal_lm_loss.KIND] == 0


def test_compile_fullgraph_train_step():
    _, patched, _ = pair("llama")
    ids, labels = batch()
    eager = patched(input_ids=ids, labels=labels).loss
    torch._dynamo.reset()
    compiled = torch.compile(patched, backend="aot_eager", fullgraph=True)(input_ids=ids, labels=labels).loss
    assert_close(compiled, eager, torch.float32)

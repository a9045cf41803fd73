"""The GPU part of the composability matrix (test_diffusers_compose.py, whose helpers and
tolerance these cases share), skipped without CUDA: group offloading with CUDA streams
(block and leaf level, either order with inject), inject + torch.compile with the default
inductor backend under the features of the CPU compile cases, and the pipeline-level
``enable_model_cpu_offload`` / ``enable_sequential_cpu_offload`` on a tiny LTXPipeline
(random weights, no text encoder or VAE: it runs from prompt embeddings to latents).

As on the CPU: a tiny fp32 model, patched with ``rope="stock"`` against stock with the same
feature, per denoising call; the feature proven active, our kernels proven to have run, and
``remove()`` giving stock-with-feature back.
"""

import copy

import pytest
import torch

from conftest import HAS_CUDA, rel_err

pytest.importorskip("diffusers")
import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels.bench import ltx_models  # noqa: E402
from test_diffusers_compose import (  # noqa: E402
    COMPILE_CASES,
    COMPILE_FEATURES,
    PATCHED,
    TOLERANCE,
    denoise,
    max_rel_err,
    offload_calls,  # noqa: F401  (fixture)
)
from test_diffusers_ltx import step_kwargs, tiny_model  # noqa: E402

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")

CUDA = torch.device("cuda")


def cuda_kwargs(model):
    """step_kwargs of a CPU-resident model, with the tensors on the GPU (the model's weights
    reach the GPU through the offload hooks)."""
    kw = step_kwargs(model, "interpolation_scale", per_token=False)
    return {k: v.to(CUDA) if torch.is_tensor(v) else v for k, v in kw.items()}


# Group offloading with a CUDA stream: weights live on the CPU (pinned), each group is copied
# to the GPU on a side stream, the next one prefetched while the current one computes (the
# execution order is recorded in the first call, by hooks that are then removed).
STREAM_OFFLOADS = {
    "group_offload_block_level_stream": lambda model: model.enable_group_offload(
        CUDA, offload_type="block_level", num_blocks_per_group=1, use_stream=True
    ),
    "group_offload_leaf_level_stream": lambda model: model.enable_group_offload(
        CUDA, offload_type="leaf_level", use_stream=True
    ),
    "group_offload_leaf_level_stream_record": lambda model: model.enable_group_offload(
        CUDA, offload_type="leaf_level", use_stream=True, record_stream=True, low_cpu_mem_usage=True
    ),
}


@pytest.mark.parametrize("order", ["feature_then_inject", "inject_then_feature"])
@pytest.mark.parametrize("feature", STREAM_OFFLOADS)
@torch.no_grad()
def test_group_offload_with_streams(feature, order, offload_calls):  # noqa: F811
    base = tiny_model("cpu", affine=True)
    kw = cuda_kwargs(base)
    plain = denoise(copy.deepcopy(base).to(CUDA), kw)

    stock = copy.deepcopy(base)
    STREAM_OFFLOADS[feature](stock)
    expected = denoise(stock, kw)
    stock_calls = offload_calls["pre_forward"]
    assert stock_calls > 0 and stock.transformer_blocks[0].norm1.weight.device.type == "cpu"  # offloaded
    assert max_rel_err(expected, plain) < TOLERANCE  # streams change nothing (a missed sync would)

    model = copy.deepcopy(base)
    if order == "feature_then_inject":
        STREAM_OFFLOADS[feature](model)
    report = lkd.inject(model, rope="stock")
    if order == "inject_then_feature":
        STREAM_OFFLOADS[feature](model)
    assert sum(report.patched.values()) == PATCHED and not report.skipped, report

    offload_calls.clear()
    outputs = denoise(model, kw)
    assert max_rel_err(outputs, expected) < TOLERANCE
    assert not torch.equal(outputs[0], expected[0]), "our kernels did not run"
    assert offload_calls["pre_forward"] == stock_calls  # every group onloaded as often as stock
    assert model.transformer_blocks[0].norm1.weight.device.type == "cpu"  # offloaded again after the calls

    assert lkd.remove(model) == PATCHED
    assert max_rel_err(denoise(model, kw), expected) < 1e-6  # stock with streams again


# Inductor's generated kernels (norms, softmax, the feature's own math around ours) sum in
# another order than eager on the GPU, and the loop's calls compound it: H100 measured up to
# 6.6e-5 relative per call (eager on the same GPU: the CPU cases' 1e-5).
INDUCTOR_TOLERANCE = 1e-4


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`")
@pytest.mark.parametrize("feature,order,fullgraph", COMPILE_CASES, ids=[f"{c[0]}-{c[1]}" for c in COMPILE_CASES])
@torch.no_grad()
def test_inductor_compile_on_top(feature, order, fullgraph):
    """torch.compile with inductor (Triton kernels around ours) of a patched model with a
    feature: the compiled denoising loop matches the eager one and stock with the feature."""
    if feature == "lora":
        pytest.importorskip("peft")
    torch._dynamo.reset()
    base = tiny_model("cuda", affine=True)
    kw = step_kwargs(base, "interpolation_scale", per_token=False)
    plain = denoise(base, kw)
    stock = copy.deepcopy(base)
    COMPILE_FEATURES[feature](stock)
    expected = denoise(stock, kw)
    assert max_rel_err(expected, plain) > 1e-2  # the feature is active

    model = copy.deepcopy(base)
    if order == "feature_then_inject":
        COMPILE_FEATURES[feature](model)
    lkd.inject(model, rope="stock")
    if order == "inject_then_feature":
        COMPILE_FEATURES[feature](model)
    eager = denoise(model, kw)
    compiled = denoise(torch.compile(model, fullgraph=fullgraph), kw)
    assert max_rel_err(compiled, eager) < INDUCTOR_TOLERANCE
    assert max_rel_err(compiled, expected) < INDUCTOR_TOLERANCE
    assert not torch.equal(compiled[0], expected[0]), "our kernels did not run"


# --- pipeline-level offload ----------------------------------------------------------------
def _pipeline_latents(pipe, transformer):
    embeds = ltx_models.prompt_embeds(transformer, batch=1, device=CUDA)
    g = torch.Generator(device=CUDA).manual_seed(0)
    return pipe(**embeds, num_frames=9, height=64, width=96, num_inference_steps=4, guidance_scale=3.0,
                output_type="latent", generator=g).frames


def _offloaded_pipeline(transformer, offload, order):
    """A tiny LTXPipeline around ``transformer`` with ``offload`` (stock when ``order`` is
    None, else inject before or after it)."""
    pipe = ltx_models.random_pipeline(transformer)
    pipe.set_progress_bar_config(disable=True)
    if order == "inject_then_offload":
        assert sum(lkd.inject(pipe, rope="stock").patched.values()) == PATCHED
    getattr(pipe, offload)(device=CUDA)
    if order == "offload_then_inject":
        assert sum(lkd.inject(pipe, rope="stock").patched.values()) == PATCHED
    return pipe


@pytest.mark.parametrize("order", ["offload_then_inject", "inject_then_offload"])
@pytest.mark.parametrize("offload", ["enable_model_cpu_offload", "enable_sequential_cpu_offload"])
@torch.no_grad()
def test_pipeline_cpu_offload(offload, order):
    pytest.importorskip("accelerate")
    base = tiny_model("cpu", affine=True)
    plain = copy.deepcopy(base).to(CUDA)
    plain_pipe = ltx_models.random_pipeline(plain)
    plain_pipe.set_progress_bar_config(disable=True)
    reference = _pipeline_latents(plain_pipe, plain)  # stock, all on the GPU

    stock = copy.deepcopy(base)
    expected = _pipeline_latents(_offloaded_pipeline(stock, offload, None), stock)
    assert rel_err(expected, reference) < TOLERANCE

    transformer = copy.deepcopy(base)
    pipe = _offloaded_pipeline(transformer, offload, order)
    out = _pipeline_latents(pipe, transformer)
    # The hooks are there and keep the weights off the GPU between calls.
    assert hasattr(transformer, "_hf_hook")
    where = transformer.transformer_blocks[0].attn1.norm_q.weight.device.type
    assert where == ("meta" if offload == "enable_sequential_cpu_offload" else "cpu")
    assert rel_err(out, expected) < TOLERANCE
    assert not torch.equal(out, expected), "our kernels did not run"

    assert lkd.remove(pipe) == PATCHED
    assert rel_err(_pipeline_latents(pipe, transformer), expected) < 1e-6

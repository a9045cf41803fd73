"""ltx_kernels.cuda_graph: a module's forward replayed from CUDA graphs, one per argument
signature. On CUDA: an injected LTX-Video model's steps, replayed, equal its eager steps bit for
bit (the same kernels on the same values), with new inputs copied in, outputs that stay the
caller's, a new graph for a new size, and release() giving the forward back; bad uses raise,
naming what is wrong. Without CUDA: capture() says that it needs a GPU."""

import pytest
import torch

import ltx_kernels.cuda_graph as cuda_graph

pytest.importorskip("diffusers")
import ltx_kernels.diffusers as lkd  # noqa: E402
from test_diffusers_ltx import as_dtype, bf16_copy, step_kwargs, tiny_model  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_capture_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="ltx_kernels.cuda_graph.capture: expected an nn.Module, got function"):
        cuda_graph.capture(lambda x: x)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without CUDA")
def test_capture_without_cuda_says_so():
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA GPU"):
        cuda_graph.capture(torch.nn.Linear(2, 2))


def test_release_of_a_module_never_captured_is_false():
    module = torch.nn.Linear(2, 2)
    assert cuda_graph.release(module) is False
    assert "forward" not in module.__dict__


def _steps(model, kw, timesteps):
    """The model's first output for each timestep (copied: the caller keeps it)."""
    outs = []
    for t in timesteps:
        inputs = dict(kw, timestep=torch.full_like(kw["timestep"], t),
                      hidden_states=kw["hidden_states"] * (1 + t / 1000))
        outs.append(model(**inputs)[0].clone())
    return outs


@cuda
@torch.no_grad()
def test_cuda_replayed_steps_equal_eager_steps():
    model = bf16_copy(tiny_model("cuda", head_dim=64))
    lkd.inject(model)
    kw = as_dtype(step_kwargs(model, "interpolation_scale", per_token=False), torch.bfloat16)
    timesteps = [900.0, 500.0, 100.0]
    expected = _steps(model, kw, timesteps)
    plain = model(**kw)[0].clone()
    patched_forward = model.__dict__.get("forward")  # (inject's model-level forward)
    cuda_graph.capture(model)
    got = _steps(model, kw, timesteps)
    for g, e in zip(got, expected):
        assert torch.equal(g, e)
    # the keyword arguments' order does not matter (the key and the copies sort them)
    reordered = dict(reversed(list(kw.items())))
    assert torch.equal(model(**reordered)[0], plain)
    assert torch.equal(model(**kw)[0], plain)
    # outputs are the caller's: a later replay does not change them
    first = model(**kw)[0]
    kept = first.clone()
    _steps(model, kw, [300.0])
    assert torch.equal(first, kept)
    # a new size records a graph of its own, and the first one still replays
    small = as_dtype(step_kwargs(model, "interpolation_scale", per_token=False, grid=(2, 3, 4)), torch.bfloat16)
    replayed_small = model(**small)[0].clone()
    assert torch.equal(model(**kw)[0], kept)
    cuda_graph.release(model)
    assert model.__dict__.get("forward") is patched_forward
    assert torch.equal(model(**small)[0], replayed_small)


@cuda
def test_cuda_bad_uses_raise_naming_the_problem():
    model = bf16_copy(tiny_model("cuda", head_dim=64))
    kw = as_dtype(step_kwargs(model, "interpolation_scale", per_token=False), torch.bfloat16)
    cuda_graph.capture(model)
    with pytest.raises(RuntimeError, match="runs without autograd: call it under torch.no_grad"):
        model(**kw)
    with torch.no_grad():
        with pytest.raises(ValueError, match="argument 'hidden_states' is on cpu"):
            model(**dict(kw, hidden_states=kw["hidden_states"].cpu()))
        with pytest.raises(ValueError, match=r"argument 'attention_kwargs\['scale'\]' \(set\) is neither a tensor nor "
                                             "hashable"):
            model(**kw, attention_kwargs={"scale": {1.0}})
    # capture again: the graphs start anew, the forward is wrapped once
    cuda_graph.capture(model)
    assert cuda_graph.release(model) is True
    assert cuda_graph.release(model) is False

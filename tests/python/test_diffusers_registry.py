"""inject's registry of model families (DESIGN.md section 7, issue 20 item 3): each family's
classes map to it, and a model inject would not change raises a clear error (a warning and an
empty report with strict=False), before anything changes."""

import types

import pytest
import torch

pytest.importorskip("diffusers")
from diffusers import FluxTransformer2DModel  # noqa: E402
from diffusers.models.embeddings import TimestepEmbedding  # noqa: E402
from diffusers.models.modeling_utils import ModelMixin  # noqa: E402

import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from ltx_kernels.integrations.diffusers import FAMILIES, family_of, flux, model_class_names  # noqa: E402
from test_diffusers_flux import tiny_flux  # noqa: E402

NAMES = [["LTXVideoTransformer3DModel"], ["LTX2VideoTransformer3DModel"], ["FluxTransformer2DModel"],
         ["SD3Transformer2DModel"],
         ["WanTransformer3DModel"], ["PixArtTransformer2DModel", "DiTTransformer2DModel"], ["UNet2DConditionModel"],
         ["AutoencoderKL"]]


def test_each_family_declares_its_classes():
    assert model_class_names() == [name for names in NAMES for name in names]
    for family, names in zip(FAMILIES, NAMES, strict=True):
        classes = family.classes()
        assert [cls.__name__ for cls in classes] == names
        assert all(cls.__module__.startswith("diffusers.") for cls in classes)


def test_family_of_an_instance_and_of_a_subclass():
    class MyFlux(FluxTransformer2DModel):
        pass

    model = tiny_flux()
    assert family_of(model) is flux.FAMILY
    assert family_of(MyFlux.__new__(MyFlux)) is flux.FAMILY  # subclasses too (isinstance)
    assert family_of(model.transformer_blocks[0]) is None
    assert family_of(torch.nn.Linear(2, 2)) is None


def unsupported_model():
    """A diffusers module holding nothing inject patches: two linears and a SiLU (seeded)."""
    torch.manual_seed(0)
    return TimestepEmbedding(8, 16).eval()


class Embedder(ModelMixin):
    """A pipeline component (a diffusers model) that inject does not support."""

    def __init__(self):
        super().__init__()
        self.embedding = unsupported_model()


def test_unsupported_model_names_its_class_and_the_supported_ones():
    model = unsupported_model()
    with pytest.raises(ValueError, match="inject: nothing to patch in TimestepEmbedding: ltx_kernels supports "
                                         "the model classes LTXVideoTransformer3DModel, LTX2VideoTransformer3DModel, "
                                         "FluxTransformer2DModel"):
        lkd.inject(model)
    assert not any(is_patched(m) for m in model.modules())


def test_strict_false_warns_and_returns_an_empty_report():
    model = unsupported_model()
    with pytest.warns(UserWarning, match="nothing to patch in TimestepEmbedding.*strict=False: nothing patched"):
        report = lkd.inject(model, strict=False)
    assert not report.patched and not report.skipped and not report.notes
    assert not any(is_patched(m) for m in model.modules())
    x = torch.randn(3, 8)
    assert torch.equal(model(x), unsupported_model()(x))  # same init: nothing changed


@pytest.mark.parametrize("strict", [1, "no", None])
def test_strict_must_be_a_bool(strict):
    with pytest.raises(TypeError, match="inject: strict must be a bool"):
        lkd.inject(tiny_flux(), strict=strict)


def test_pipeline_patches_its_supported_models_and_notes_the_others():
    pipe = types.SimpleNamespace(components={"transformer": tiny_flux(), "embedder": Embedder(), "tokenizer": "t"})
    report = lkd.inject(pipe)
    assert report.patched[flux.BLOCK_KIND] == 2
    assert report.notes == ["Embedder: nothing ltx_kernels patches in this model; left as it is"]
    assert not any(is_patched(m) for m in pipe.components["embedder"].modules())


def test_pipeline_of_unsupported_models_raises():
    pipe = types.SimpleNamespace(components={"a": Embedder(), "b": Embedder()})
    with pytest.raises(ValueError, match="nothing to patch in Embedder, Embedder: ltx_kernels supports"):
        lkd.inject(pipe)


def test_attention_alone_makes_a_model_supported():
    """A model whose only change is the attention backend is supported when attention is asked."""
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    attn = Attention(query_dim=16, heads=2, dim_head=8)
    if not hasattr(attn.processor, "_attention_backend"):
        attn.set_processor(AttnProcessor2_0())
    holder = torch.nn.Sequential(attn)
    dispatched = hasattr(attn.processor, "_attention_backend")
    if not dispatched:  # the stock processor of this diffusers computes attention itself
        with pytest.raises(ValueError, match="nothing to patch in Sequential"):
            lkd.inject(holder, attention="bf16")
    else:
        report = lkd.inject(holder, attention="bf16")
        assert sum(report.patched.values()) >= 1
    with pytest.raises(ValueError, match="nothing to patch in Sequential"):
        lkd.inject(holder)

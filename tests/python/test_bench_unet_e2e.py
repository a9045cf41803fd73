"""The UNet end-to-end benchmark (python -m ltx_kernels.bench.unet_e2e) on the CPU: the
full-size configs are the checkpoints' (shapes only, on the meta device), and its tiny
configs' models and inputs run through the benchmark's modes (its GPU run uses the full sizes)."""

import pytest
import torch

from conftest import rel_err

pytest.importorskip("diffusers")
import ltx_kernels.diffusers as lkd  # noqa: E402
from ltx_kernels._patching import is_patched  # noqa: E402
from ltx_kernels.bench import harness, unet_e2e  # noqa: E402
from ltx_kernels.bench.ltx_e2e import set_mode  # noqa: E402
from test_diffusers_flux import assert_fp8_within_format_error, inject_quietly  # noqa: E402

TINY = ["sdxl-tiny", "sd15-tiny"]


def tiny(config):
    model = unet_e2e.random_unet(config, torch.float32, "cpu")
    return model, unet_e2e.step_inputs(model, unet_e2e.CONFIGS[config][1], "cpu")


@pytest.mark.parametrize("config, parameters, latent", [("sdxl", 2_567_463_684, 128), ("sd15", 859_520_964, 64)])
def test_full_size_configs_are_the_checkpoints(config, parameters, latent):
    """The parameter counts of stabilityai/stable-diffusion-xl-base-1.0's and SD 1.5's UNets;
    the full-size inputs fit the model (a forward on the meta device) and the report names the
    64x64 attention level's tokens."""
    model = unet_e2e.random_unet(config, torch.bfloat16, "meta")
    assert sum(p.numel() for p in model.parameters()) == parameters
    size = unet_e2e.CONFIGS[config][1]
    kw = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"),
                                           unet_e2e.step_inputs(model, size, "cpu"))
    assert kw["encoder_hidden_states"].shape == (2, 77, model.config.cross_attention_dim)
    if config == "sdxl":
        assert kw["added_cond_kwargs"]["text_embeds"].shape == (2, 1280)
        assert kw["added_cond_kwargs"]["time_ids"].shape == (2, 6)
    with torch.no_grad():
        assert model(**kw)[0].shape == (2, 4, latent, latent)
    assert unet_e2e.attention_tokens(model, size) == 64 * 64


@pytest.mark.parametrize("config", TINY)
def test_tiny_inputs_run_stock_and_injected(config):
    """The ours modes' inject on the benchmark's model (by-class patches now; the UNet
    integration's once registered), against stock."""
    model, kw = tiny(config)
    with torch.no_grad():
        ref = model(**kw)[0]
        report = inject_quietly(model)
        assert sum(report.patched.values()) > 0, report
        assert ref.shape == (2, 4, 8, 8) and rel_err(model(**kw)[0], ref) < 1e-5


@pytest.mark.parametrize("mode", ["compile", "ours+compile"])
def test_compile_modes_compile_the_transformer_blocks(mode):
    """UNet2DConditionModel declares its BasicTransformerBlocks as repeated blocks: the compile
    modes compile each of them (lazily: nothing runs here), and eager undoes it and inject."""
    model, _ = tiny("sdxl-tiny")
    blocks = [m for m in model.modules() if type(m).__name__ == "BasicTransformerBlock"]
    assert len(blocks) == 2 + 2 + 2 * 2  # down (2 layers), mid (2), up (2 resnets x 2 layers)
    set_mode(model, mode)
    assert all(block._compiled_call_impl is not None for block in blocks)
    assert any(is_patched(m) for m in model.modules()) == mode.startswith("ours")
    set_mode(model, "eager")
    assert all(block._compiled_call_impl is None for block in blocks)
    assert not any(is_patched(m) for m in model.modules())


@pytest.mark.parametrize("config", ["sdxl-tiny", "sd15-tiny"])
def test_fp8_mode_runs_within_the_format_error(config):
    """The ours-fp8 modes' inject(precision="fp8") on a fresh model (emulated on the CPU).
    SDXL's transformers feed proj_in a permuted view of the GroupNorm's output (last dim
    strided), which the FP8 linear takes as nn.Linear does."""
    model, kw = tiny(config)
    report = assert_fp8_within_format_error(model, kw)
    assert report.patched, report


def test_without_cuda_it_says_what_runs_on_the_cpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert unet_e2e.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("the UNet end-to-end benchmark needs a CUDA device")
    assert all(command in err for command, _ in harness.ON_THE_CPU)

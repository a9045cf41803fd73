"""examples/generate_image.py runs offline (--random-weights, tiny configs on the CPU) for FLUX,
SD3, SDXL and PixArt, with and without the kernels, FP8 and compile."""

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "generate_image.py"


def load_script():
    spec = importlib.util.spec_from_file_location("generate_image", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(tmp_path, family, *flags):
    return load_script().main(["--family", family, "--random-weights", "--device", "cpu", "--height", "64",
                               "--width", "64", "--steps", "3", "--dtype", "float32", "--output",
                               str(tmp_path / "image.png"), *flags])


@pytest.mark.parametrize("family, shape", [("flux", (1, 16, 16)), ("sd3", (1, 4, 8, 8)), ("sdxl", (1, 4, 8, 8)),
                                           ("pixart", (1, 4, 8, 8))])
def test_kernels_give_the_stock_latents(tmp_path, family, shape):
    ours = run(tmp_path, family)
    latents = torch.load(tmp_path / "image.pt")
    stock = run(tmp_path, family, "--no-optimized-kernels")
    assert len(ours["step_ms"]) == 3 and ours["config"] == "tiny" and stock["kernels"] == "off"
    assert ours["kernels"] and latents.shape == shape and torch.isfinite(latents).all()
    reference = torch.load(tmp_path / "image.pt")
    assert ((latents - reference).norm() / reference.norm()).item() < 1e-4


@pytest.mark.parametrize("family", ["pixart", "sdxl"])
def test_fp8_and_compile_run(tmp_path, family):
    summary = run(tmp_path, family, "--precision", "fp8", "--compile")
    assert any("fp8" in kind for kind in summary["kernels"]), summary["kernels"]
    assert torch.isfinite(torch.load(tmp_path / "image.pt")).all()


def test_full_size_on_the_cpu_needs_allow_cpu():
    with pytest.raises(SystemExit, match="Pass --allow-cpu"):
        load_script().main(["--family", "pixart", "--random-weights", "--config", "full", "--device", "cpu"])
    with pytest.raises(SystemExit, match="run through ltx_kernels"):
        load_script().main(["--precision", "fp8", "--no-optimized-kernels", "--random-weights", "--device", "cpu"])

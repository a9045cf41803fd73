"""examples/generate_video.py runs offline (--random-weights) with and without the kernels."""

import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import HAS_CUDA, rel_err

pytest.importorskip("diffusers")
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "generate_video.py"


def load_script():
    spec = importlib.util.spec_from_file_location("generate_video", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kernels", ["--use-optimized-kernels", "--no-optimized-kernels"])
def test_random_weights_cpu(tmp_path, kernels):
    out = tmp_path / "video.mp4"
    summary = load_script().main([
        "--random-weights", "--config", "tiny", "--device", "cpu", "--num-frames", "9", "--height", "64",
        "--width", "96", "--steps", "3", "--output", str(out), kernels,
    ])
    assert len(summary["step_ms"]) == 3
    split = summary["split_s"]
    assert list(split) == ["text encoder", "denoising", "VAE decode", "other"]
    assert split["VAE decode"] == 0.0 and split["text encoder"] > 0  # no VAE with random weights
    assert split["denoising"] > 0 and sum(split.values()) == pytest.approx(summary["total_s"], rel=1e-6, abs=1e-6)
    assert summary["peak_gib"] > 0  # the process's RSS on the CPU, never NaN
    assert (tmp_path / "video.png").stat().st_size > 0
    latents = torch.load(tmp_path / "video.pt")
    assert latents.shape == (1, 2 * 2 * 3, 8) and torch.isfinite(latents).all()
    assert (summary["kernels"] == "off") == (kernels == "--no-optimized-kernels")


def test_cpu_runs_the_tiny_config_and_says_so(tmp_path, capsys):
    summary = load_script().main([
        "--random-weights", "--device", "cpu", "--num-frames", "9", "--height", "64", "--width", "96",
        "--steps", "2", "--output", str(tmp_path / "v.mp4"),
    ])
    out = capsys.readouterr().out
    assert summary["config"] == "tiny" and "no CUDA GPU found: running the tiny" in out
    assert "device cpu, tiny, 2 steps" in out and "process RSS" in out


def test_full_size_on_the_cpu_needs_allow_cpu():
    with pytest.raises(SystemExit, match="Pass --allow-cpu"):
        load_script().main(["--random-weights", "--device", "cpu", "--config", "2b"])
    with pytest.raises(SystemExit, match="Pass --allow-cpu"):
        load_script().main(["--device", "cpu"])  # the real model


def test_precision_fp8_cpu(tmp_path):
    """--precision fp8 reaches inject (the tiny config's 40-wide linears stay bf16, reported)."""
    summary = load_script().main([
        "--random-weights", "--config", "tiny", "--device", "cpu", "--num-frames", "9", "--height", "64",
        "--width", "96", "--steps", "2", "--precision", "fp8", "--output", str(tmp_path / "v.mp4"),
    ])
    assert summary["precision"] == "fp8" and len(summary["step_ms"]) == 2
    with pytest.raises(SystemExit, match="drop --no-optimized-kernels"):
        load_script().main(["--random-weights", "--precision", "fp8", "--no-optimized-kernels"])


def test_attention_cpu(tmp_path):
    """--attention 8bit reaches inject: the transformer's attention modules run ltx_kernels_8bit,
    whose latents are within 8-bit error of SDPA's, not equal to them."""
    args = ["--random-weights", "--config", "tiny", "--device", "cpu", "--num-frames", "9", "--height", "64",
            "--width", "96", "--steps", "2"]
    sdpa = load_script().main(args + ["--output", str(tmp_path / "sdpa.mp4")])
    ours = load_script().main(args + ["--attention", "8bit", "--output", str(tmp_path / "ours.mp4")])
    assert sdpa["attention"] == "sdpa" and not any("attention backend" in kind for kind in sdpa["kernels"])
    assert ours["attention"] == "8bit" and ours["kernels"]["LTXAttention (attention backend 'ltx_kernels_8bit')"] == 4
    err = rel_err(torch.load(tmp_path / "ours.pt"), torch.load(tmp_path / "sdpa.pt"))
    assert 1e-5 < err < 4e-2, err
    with pytest.raises(SystemExit, match="--attention bf16 runs through ltx_kernels: drop --no-optimized-kernels"):
        load_script().main(["--random-weights", "--attention", "bf16", "--no-optimized-kernels"])


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_kernels_and_compile_together(tmp_path):
    summary = load_script().main([
        "--random-weights", "--config", "tiny", "--num-frames", "9", "--height", "64", "--width", "96",
        "--steps", "2", "--warmup-iterations", "1", "--compile", "--output", str(tmp_path / "v.mp4"),
    ])
    assert summary["compile"] and summary["kernels"] != "off"


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.get_device_capability() < (8, 9), reason="needs an FP8 GPU")
def test_fp8_and_compile_together(tmp_path):
    summary = load_script().main([
        "--random-weights", "--config", "tiny", "--num-frames", "9", "--height", "64", "--width", "96",
        "--steps", "2", "--precision", "fp8", "--compile", "--output", str(tmp_path / "v.mp4"),
    ])
    assert summary["compile"] and summary["precision"] == "fp8"


ARGS = ["--random-weights", "--config", "tiny", "--device", "cpu", "--num-frames", "9", "--height", "64",
        "--width", "96", "--steps", "2"]


def parallel_rank(rank, port, out):
    """One torchrun rank: torchrun's environment, then the script's main."""
    import os

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    load_script().main([*ARGS, "--parallel", "cfg", "--output", out])


def test_parallel_cfg_under_torchrun_cpu(tmp_path):
    """--parallel cfg on 2 ranks (gloo on the CPU): rank 0 alone writes, the latents those of
    one process (each rank computed half of each step's CFG batch)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free port for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(parallel_rank, args=(port, str(tmp_path / "parallel.mp4")), nprocs=2)
    load_script().main([*ARGS, "--output", str(tmp_path / "one.mp4")])
    parallel, one = torch.load(tmp_path / "parallel.pt"), torch.load(tmp_path / "one.pt")
    assert rel_err(parallel, one) < 1e-4  # the tiny model in bf16: rounding of a batch of 1 vs 2


def test_parallel_needs_torchrun(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="--parallel cfg runs under torchrun"):
        load_script().main([*ARGS, "--parallel", "cfg"])

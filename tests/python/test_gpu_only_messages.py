"""The GPU-only entry points (the benchmarks), run where there is no CUDA device: they exit
with status 2 and a message that says so and names what to run on the CPU instead, and the
commands it names exist."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from ltx_kernels import cli
from ltx_kernels.bench import dit_e2e, fidelity, flux_e2e, harness, llm_e2e, ltx2_e2e, ltx_e2e, wan_e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("what, argv", [
    ("ltx-kernels bench", ["bench"]),
    ("the attention benchmark", ["bench", "attention"]),
    ("the GEMM benchmark", ["bench", "gemm"]),
])
def test_cli_benchmarks_say_what_runs_on_the_cpu(what, argv, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU machine too checks the message
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{what} needs a CUDA device")
    assert all(command in err and purpose in err for command, purpose in harness.ON_THE_CPU)


@pytest.mark.parametrize("bench_module", [llm_e2e, ltx_e2e, fidelity, flux_e2e, dit_e2e, wan_e2e,
                                                         ltx2_e2e])
def test_module_benchmarks_say_what_runs_on_the_cpu(bench_module, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_module.main([]) == 2
    err = capsys.readouterr().err
    assert all(command in err for command, _ in harness.ON_THE_CPU)


def test_what_runs_on_the_cpu_exists():
    for command, _ in harness.ON_THE_CPU:
        script = re.match(r"(?:python|bash) ([\w/.]+\.(?:py|sh))", command)
        module = re.match(r"python -m ([\w.]+)", command)
        assert script or module, command
        if script:
            assert (ROOT / script.group(1)).is_file(), command
        else:
            assert importlib.util.find_spec(module.group(1)) is not None, command

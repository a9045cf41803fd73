"""The cache benchmark (python -m ltx_kernels.bench.ltx_cache) runs on the CPU with the tiny
config: every mode in one run, the cache's evaluation counts, the ratios."""

import json

import pytest

pytest.importorskip("diffusers")
from ltx_kernels.bench import ltx_cache  # noqa: E402

STEPS = 4


@pytest.mark.filterwarnings("ignore:ltx_kernels.diffusers.inject. not patched")  # the tiny linears under FP8
def test_tiny_cpu_run(tmp_path, capsys):
    """A threshold at which the tiny random model's cache skips calls, so that the counts
    are not trivially all-full; aot_eager stands in for inductor on the CPU; the FP8 mode
    runs on a fresh copy (the tiny model's 40-wide linears stay bf16: the path, not FP8)."""
    out = tmp_path / "cache.json"
    assert ltx_cache.main([
        "--config", "tiny", "--device", "cpu", "--frames", "9", "--height", "64", "--width", "96",
        "--steps", str(STEPS), "--threshold", "0.3", "--reps", "1", "--compile-backend", "aot_eager",
        "--modes", *ltx_cache.DEFAULT_MODES, "ours-fp8+fbc",
        "--json", str(out), "--markdown", str(tmp_path / "cache.md"),
    ]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())["results"]}
    assert list(rows) == [*ltx_cache.DEFAULT_MODES, "ours-fp8+fbc"]
    for row in rows.values():
        assert row["transformer_calls"] == STEPS and 0 < row["full_evaluations"] < STEPS  # the cache skipped
        assert row["loop_ms"] > 0 and not row["evaluations_vary"] and row["graphs_compiled_while_timed"] == 0
    assert len({r["full_evaluations"] for r in rows.values()}) == 1
    assert rows["stock+fbc"]["err_vs_stock_fbc"] == 0 and 0 < rows["ours+fbc"]["err_vs_stock_fbc"] < 5e-2
    printed = capsys.readouterr().out
    assert "the times compare one to one" in printed and "ours+fbc / stock+fbc: " in printed
    assert (tmp_path / "cache.md").read_text().count("| ours+fbc") == 2


def test_summary_says_when_the_evaluations_differ():
    rows = [dict(mode=m, loop_ms=ms, full_evaluations=n, transformer_calls=30, evaluations_vary=False,
                 graphs_compiled_while_timed=0) for m, ms, n in (("stock+fbc", 1000, 17), ("ours+fbc", 650, 18))]
    lines = ltx_cache.summary(rows)
    assert "DIFFERENT numbers of full transformer evaluations (stock+fbc 17, ours+fbc 18)" in lines[0]
    assert "ours+fbc / stock+fbc: 0.650x" in lines[1]


def test_full_size_on_the_cpu_needs_allow_cpu(capsys):
    assert ltx_cache.main(["--device", "cpu"]) == 2
    assert "--allow-cpu" in capsys.readouterr().err

"""The benchmarks' reports, on the CPU: the ops benchmark's worst speed-up per op against the best
anchor (issue 18's held-out run reads it), --held-out reaching the no-GPU message, and the LTX
e2e report's largest kernels outside GEMM and attention."""

import pytest
import torch

from ltx_kernels.bench import __main__ as bench
from ltx_kernels.bench.harness import Result, worst_speedups


def result(op, shape, impl, us):
    return Result(op, shape, impl, us, 0.0, 0.0)


def test_worst_speedup_is_against_the_fastest_anchor_at_the_worst_shape():
    results = [
        result("rms_norm", "1x1536 bf16", "ltx_kernels", 4.0), result("rms_norm", "1x1536 bf16", "eager", 8.0),
        result("rms_norm", "1x1536 bf16", "liger", 5.0),  # 1.25x: ours faster
        result("rms_norm", "7x2560 fp16", "ltx_kernels", 10.0), result("rms_norm", "7x2560 fp16", "eager", 20.0),
        result("rms_norm", "7x2560 fp16", "compile", 7.0),  # 0.70x: the worst, against compile
        result("rms_norm", "64x3072 bf16", "ltx_kernels", 10.0), result("rms_norm", "64x3072 bf16", "eager", 9.0),
        result("layer_norm", "1x1536 bf16", "ltx_kernels", 3.0), result("layer_norm", "1x1536 bf16", "eager", 6.0),
        result("layer_norm", "7x1536 bf16", "eager", 6.0),  # ours did not run here: no ratio
    ]
    lines = worst_speedups(results).splitlines()
    assert lines == ["- rms_norm: worst 0.70x vs the best anchor (7x2560 fp16); slower on 2 of 3 shapes",
                     "- layer_norm: worst 2.00x vs the best anchor (1x1536 bf16); slower on 0 of 1 shapes"]


def test_held_out_sizes_cover_every_d_and_row_count():
    assert len(bench.HELD_OUT_D) == 5 and len(bench.HELD_OUT_ROWS) == 7
    assert {tag for tag, _, _ in bench.HELD_OUT_VARIANTS} == {"bf16", "bf16 strided", "fp16"}


def test_held_out_run_says_it_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--held-out"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_ops_report_writes_the_header_table_worst_ratios_and_json(tmp_path, capsys):
    """write_ops_report (the ops and forward + backward benchmarks): the same text printed and
    written, the raw results in the JSON."""
    import json

    from ltx_kernels.bench.harness import write_ops_report

    results = [result("rms_norm", "1x1536 bf16", "ltx_kernels", 4.0), result("rms_norm", "1x1536 bf16", "eager", 8.0)]
    meta = {"gpu": "GPU X", "torch": "t", "triton": "tr"}
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    write_ops_report(results, ["ltx_kernels", "eager"], meta, 3004.4, "bf16, us.", str(js), str(md))
    text = md.read_text()
    assert text.startswith("GPU X, torch t, triton tr; copy 3004 GB/s. bf16, us.\n\n| op | shape |")
    assert text.rstrip().endswith("- rms_norm: worst 2.00x vs the best anchor (1x1536 bf16); slower on 0 of 1 shapes")
    assert text in capsys.readouterr().out
    assert json.loads(js.read_text())["results"][1]["us"] == 8.0


def test_ltx_e2e_markdown_lists_each_rows_largest_other_kernels():
    """The e2e report names, per row, the kernels outside GEMM and attention by GPU time, in the
    profiler's order, their names short (ours and ATen's namespaces dropped, cut to fit)."""
    import argparse

    from ltx_kernels.bench import harness, ltx_e2e

    norm = ("void ltx_kernels::norm_cuda::norm_cached_kernel<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, 8, 4, "
            "(ltx_kernels::NormType)0, false, 64, true, true>(ltx_kernels::NormParams)")
    quantize = "void ltx_kernels::(anonymous namespace)::quantize_fp8_kernel<__nv_bfloat16, 8, 256>(QuantizeParams)"
    row = {"frames": 161, "tokens": 8064, "mode": "ours-fp8", "step_ms": 120.0, "peak_mem_gib": 2.7,
           "err_vs_eager": 0.0, "first_call_s": 0.3,
           "kernels_ms": {"gemm": 41.0, "attention": 57.0, "other": 14.0,
                          "other_kernels": {quantize: 3.76, norm: 1.62}}}
    args = argparse.Namespace(config="2b", height=512, width=768, reps=5, loop_steps=0)
    text = ltx_e2e.markdown([row], {"gpu": "H100", "torch": "2.11"}, args)
    table = text.split("Largest kernels outside GEMM and attention")[1]
    lines = [line for line in table.splitlines() if line.startswith("| 161f")]
    assert lines == [f"| 161f ours-fp8 | 3.76 | `{harness.kernel_label(quantize)}` |",
                     f"| 161f ours-fp8 | 1.62 | `{harness.kernel_label(norm)}` |"]
    assert harness.kernel_label(quantize) == "quantize_fp8_kernel<__nv_bfloat16, 8, 256>(QuantizeParams)"
    short = harness.kernel_label(norm, width=40)
    assert len(short) == 40 and short.startswith("norm_cached_kernel<") and short.endswith("...")


def test_image_model_e2e_markdown_lists_each_rows_largest_other_kernels():
    """The same section in the report that the FLUX, LTX-2, Wan, DiT and UNet benchmarks share."""
    from ltx_kernels.bench import flux_e2e, harness

    name = "void at::native::elementwise_kernel<128, 4, CUDAFunctor_add<c10::BFloat16>>(int)"
    row = {"tokens": 4096, "mode": "ours", "step_ms": 130.0, "peak_mem_gib": 30.0, "err_vs_eager": 1e-3,
           "first_call_s": 2.0, "kernels_ms": {"gemm": 80.0, "attention": 40.0, "other": 10.0,
                                               "other_kernels": {name: 0.25}}}
    text = flux_e2e.markdown([row], {"gpu": "H100", "torch": "2.11"}, "FLUX.1-dev", 10)
    table = text.split("Largest kernels outside GEMM and attention")[1]
    assert [line for line in table.splitlines() if line.startswith("| ours")] == [
        "| ours | 0.25 | `elementwise_kernel<128, 4, CUDAFunctor_add<c10::BFloat16>>(int)` |"]
    assert harness.kernel_label(name).startswith("elementwise_kernel<")


def test_ltx_e2e_report_and_plot_take_every_mode(tmp_path):
    """Every mode of the LTX e2e benchmark gets its speed-ups in the report (the CUDA-graph step
    of the FP8 + exact attention mode against the same mode without graphs and against torchao)
    and a bar in the plot (more modes than the palette's colours: they repeat)."""
    import argparse
    import json

    from ltx_kernels.bench import ltx_e2e

    rows = [{"frames": 161, "tokens": 8064, "mode": mode, "step_ms": 100.0 + i, "peak_mem_gib": 2.7,
             "err_vs_eager": 0.0, "first_call_s": 0.3, "kernels_ms": {"gemm": 41.0, "attention": 57.0, "other": 14.0}}
            for i, mode in enumerate(ltx_e2e.MODES)]
    args = argparse.Namespace(config="2b", height=512, width=768, reps=5, loop_steps=0)
    text = ltx_e2e.markdown(rows, {"gpu": "H100", "torch": "2.11"}, args)
    by = {r["mode"]: r["step_ms"] for r in rows}
    graph = "ours-fp8+attnbf16+cudagraph"
    assert graph in ltx_e2e.QUANTIZED
    for anchor in ("ours-fp8+attnbf16", "torchao-fp8+compile"):
        assert f"161f: {graph} vs {anchor} {by[anchor] / by[graph]:.2f}x" in text
    pytest.importorskip("matplotlib")
    (tmp_path / "rows.json").write_text(json.dumps({"meta": {"gpu": "H100", "config": "2b"}, "results": rows}))
    ltx_e2e.plot(str(tmp_path / "rows.json"), str(tmp_path / "rows.png"))
    assert (tmp_path / "rows.png").stat().st_size > 0

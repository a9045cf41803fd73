"""Timing and reporting shared by the micro-benchmarks.

Method: median GPU time with the L2 flushed between runs (see bench_us); bytes that must move (each input read once, each output written once) over
time, as a percentage of a large device-to-device copy measured in the same run.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
import statistics
import sys
import time
from typing import Callable

import torch

# What runs without a GPU, from a checkout of the repository: (command, what it does).
ON_THE_CPU = (
    ("python examples/generate_video.py --random-weights", "a tiny LTX-Video model, end to end (under a minute)"),
    ("python -m ltx_kernels.bench.ltx_cache --config tiny --device cpu --frames 9 --height 64 --width 96 --steps 8",
     "the denoising loop with a cache, timed per mode (about a minute)"),
    ("bash scripts/test.sh", "every op against its CPU reference, and the integrations (the test suite)"),
)


def no_cuda(what: str) -> int:
    """Says on stderr that ``what`` needs a CUDA device and what to run on the CPU instead;
    returns the exit status."""
    instead = "".join(f"\n  {command}\n      {purpose}" for command, purpose in ON_THE_CPU)
    print(f"{what} needs a CUDA device: it times GPU kernels. Without one, from the repository:{instead}",
          file=sys.stderr)
    return 2


def bench_us(fn: Callable[[], object], reps: int = 100) -> float:
    """Median GPU time of fn in microseconds, L2 flushed before each run.

    Like triton.testing.do_bench, but the GPU is first held busy (torch.cuda._sleep) while
    the host queues every run, so host-side launch overhead is never in the measurement:
    on a slow host, a Python-heavy launcher (eager, Liger) otherwise leaves the GPU idle
    between runs and its times swing by 50%. This measures the kernels, which is what the
    bandwidth percentages are about; launch overhead shows in the end-to-end benchmarks.
    """
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    # Host time to queue one run, to size the GPU sleep that covers queuing all of them.
    t0 = time.perf_counter()
    for _ in range(5):
        flush.zero_()
        fn()
    host_us = (time.perf_counter() - t0) / 5 * 1e6
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda._sleep(int(reps * (host_us + 50.0) * 2000))  # cycles at <= 2 GHz
    for start, end in zip(starts, ends):
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def copy_bandwidth_gbs(gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    n = int(gib * 2**30) // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    us = bench_us(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / us / 1e3


def release_memory() -> None:
    """Between two benchmark modes: what the last one left is collected, then its cached blocks
    freed, so that the next mode's peak memory is its own. Collected first: a CUDA graph's
    memory pool can be kept alive by a reference cycle until the garbage collector runs (an LTX
    FP8 mode read 9.98 GiB after a '+cudagraph' mode, 6.28 on its own)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def peak_memory_gib(cuda: bool) -> tuple[float, str]:
    """(GiB, what was measured): the GPU's peak allocated memory since the last reset, or
    without CUDA the process's peak resident memory (ru_maxrss, KiB on Linux). For the examples."""
    if cuda:
        return torch.cuda.max_memory_allocated() / 2**30, "GPU"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process RSS"


def random_model(cls: type, config: dict, dtype: torch.dtype, device, seed: int = 0) -> torch.nn.Module:
    """``cls(**config)`` with seeded random weights, built in ``dtype`` on ``device`` (as
    ``from_pretrained(torch_dtype=...)`` builds it; on the GPU a 10 B model takes seconds, on the
    CPU minutes; ``"meta"``: shapes only), in eval mode without gradients."""
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(seed)
        with torch.device(device):
            model = cls(**config)
    finally:
        torch.set_default_dtype(default_dtype)
    return model.eval().requires_grad_(False)


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype ``model`` computes in: that of most of its parameters' elements stored in 16 or
    32 bits. Not simply the first parameter's: after ``inject(precision="fp8")`` a linear's
    weight is stored in 8 bits and may come first, and a bf16 Wan keeps its first parameter (a
    modulation table) in fp32."""
    elements = collections.Counter()
    for p in model.parameters():
        if p.dtype.is_floating_point and p.element_size() > 1:
            elements[p.dtype] += p.numel()
    return elements.most_common(1)[0][0]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp64: the sanity check of ours against the eager anchor."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


@dataclasses.dataclass
class Case:
    """One op at one shape, with every implementation to compare."""

    op: str
    shape: str  # label, e.g. "ltx161f 16128x2048"
    bytes_moved: int
    impls: dict[str, Callable[[], object]]  # "ltx_kernels" first, then the anchors
    check: Callable[[], float] | None = None  # relative error of ours vs eager


@dataclasses.dataclass
class Result:
    op: str
    shape: str
    impl: str
    us: float
    gbs: float
    pct_copy: float


def run_cases(cases: list[Case], copy_gbs: float, log=print) -> list[Result]:
    results = []
    for case in cases:
        if case.check is not None:
            err = case.check()
            if not err <= 2e-2:
                raise AssertionError(f"{case.op} {case.shape}: ltx_kernels differs from eager ({err:.3g})")
        for impl, fn in case.impls.items():
            try:
                us = bench_us(fn)
            except Exception as exc:  # an anchor that cannot run this case is reported, not fatal
                log(f"  {case.op} {case.shape} {impl}: failed ({type(exc).__name__}: {exc})")
                continue
            gbs = case.bytes_moved / us / 1e3
            results.append(Result(case.op, case.shape, impl, us, gbs, 100 * gbs / copy_gbs))
        log(f"  {case.op:<28} {case.shape:<22} " + "  ".join(
            f"{r.impl}={r.us:.1f}us" for r in results if r.op == case.op and r.shape == case.shape))
    return results


def markdown_table(results: list[Result], impls: list[str]) -> str:
    """One row per (op, shape): each impl's us (% of copy), and ours vs the best anchor."""
    rows: dict[tuple[str, str], dict[str, Result]] = {}
    for r in results:
        rows.setdefault((r.op, r.shape), {})[r.impl] = r
    head = "| op | shape | " + " | ".join(impls) + " | speed-up vs best anchor |"
    lines = [head, "|" + "---|" * (len(impls) + 3)]
    for (op, shape), by_impl in rows.items():
        cells = []
        for impl in impls:
            r = by_impl.get(impl)
            cells.append(f"{r.us:.1f} us ({r.pct_copy:.0f}%)" if r else "-")
        ours = by_impl.get("ltx_kernels")
        anchors = [r.us for name, r in by_impl.items() if name != "ltx_kernels"]
        speedup = f"{min(anchors) / ours.us:.2f}x" if ours and anchors else "-"
        lines.append(f"| {op} | {shape} | " + " | ".join(cells) + f" | {speedup} |")
    return "\n".join(lines)


def worst_speedups(results: list[Result]) -> str:
    """Per op, ours vs the best anchor at its worst shape (the number a user at that shape
    sees), and on how many shapes ours is slower, as markdown lines."""
    ratios: dict[str, list[tuple[float, str]]] = {}
    by_case: dict[tuple[str, str], dict[str, float]] = {}
    for r in results:
        by_case.setdefault((r.op, r.shape), {})[r.impl] = r.us
    for (op, shape), us in by_case.items():
        anchors = [t for impl, t in us.items() if impl != "ltx_kernels"]
        if "ltx_kernels" in us and anchors:
            ratios.setdefault(op, []).append((min(anchors) / us["ltx_kernels"], shape))
    lines = []
    for op, values in ratios.items():
        worst, shape = min(values)
        slower = sum(v < 1.0 for v, _ in values)
        lines.append(f"- {op}: worst {worst:.2f}x vs the best anchor ({shape}); slower on {slower} of "
                     f"{len(values)} shapes")
    return "\n".join(lines)


def write_ops_report(results: list[Result], impls: list[str], meta: dict, copy_gbs: float, what: str,
                     json_path: str | None, markdown_path: str | None) -> None:
    """Prints an op benchmark's table with the worst ratio per op, under a header naming the
    machine and ``what`` each cell is, and writes it and the raw results if asked."""
    table = markdown_table(results, impls) + "\n\n" + worst_speedups(results)
    header = (f"{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}; copy {copy_gbs:.0f} GB/s. "
              f"{what}\n\n")
    print()
    print(header + table)
    if json_path:
        write_json(json_path, meta, results)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(header + table + "\n")


def write_json(path: str, meta: dict, results: list[Result]) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": [dataclasses.asdict(r) for r in results]}, f, indent=1)


def device_meta(copy_gbs: float) -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_gbs": None if copy_gbs is None else round(copy_gbs, 1),
    }


GEMM_KEYS = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk")
ATTENTION_KEYS = ("flash", "fmha", "attention", "sdpa")


def idle_ms(intervals: list[tuple[float, float]]) -> float:
    """Milliseconds between the first start and the last end of ``intervals`` ((start, end) in
    us, any order, overlaps allowed) that no interval covers."""
    idle, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is not None and start > reach:
            idle += start - reach
        reach = end if reach is None else max(reach, end)
    return idle / 1e3


def kernel_split_ms(step, top: int = 8) -> dict:
    """GPU ms of one ``step()`` per kernel kind (GEMM / attention / other), from the profiler;
    under ``other_kernels`` the ``top`` kernels of the other kind by time (what a fusion would
    remove); under ``idle`` the time between the step's first and last kernel when none ran
    (launch gaps and waits for the host: what a CUDA graph can remove)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    split = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    others: dict[str, float] = {}
    intervals = []
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        intervals.append((event.time_range.start, event.time_range.end))
        name = event.name.lower()
        # attention first: memory-efficient SDPA kernels carry "cutlass" in their names
        kind = ("attention" if any(k in name for k in ATTENTION_KEYS)
                else "gemm" if any(k in name for k in GEMM_KEYS) else "other")
        split[kind] += event.device_time_total / 1e3
        if kind == "other":
            others[event.name[:160]] = others.get(event.name[:160], 0.0) + event.device_time_total / 1e3
    split["other_kernels"] = dict(sorted(others.items(), key=lambda kv: -kv[1])[:top])
    split["idle"] = idle_ms(intervals)
    return split


def split_text(kernels_ms: dict, digits: int = 1) -> str:
    """A row's kernel split for an e2e table: 'GEMM / attention / other / idle' in ms (idle '-'
    for rows measured before it was)."""
    idle = kernels_ms.get("idle")
    parts = [kernels_ms["gemm"], kernels_ms["attention"], kernels_ms["other"]]
    return " / ".join([f"{v:.{digits}f}" for v in parts] + ["-" if idle is None else f"{idle:.{digits}f}"])


def kernel_label(name: str, width: int = 110) -> str:
    """A profiler kernel name made short enough for a table: no return type, no namespaces of
    ours or ATen's, cut to ``width`` characters (the template arguments that tell variants
    apart, e.g. a norm kernel's row layout, stay as far as they fit)."""
    for prefix in ("void ", "ltx_kernels::", "(anonymous namespace)::", "norm_cuda::", "at::native::"):
        name = name.replace(prefix, "")
    return name if len(name) <= width else name[: width - 3] + "..."


def other_kernels_markdown(rows: list[dict], label: Callable[[dict], str]) -> str:
    """The largest kernels outside GEMM and attention of each row (``kernels_ms["other_kernels"]``
    from :func:`kernel_split_ms`), GPU ms a step: where a fusion would pay; a section of the e2e
    reports, its heading included. ``label(row)`` names the row."""
    lines = ["Largest kernels outside GEMM and attention, GPU ms a step:", "", "| row | GPU ms | kernel |",
             "|---|---|---|"]
    for r in rows:
        for name, ms in r["kernels_ms"].get("other_kernels", {}).items():
            lines.append(f"| {label(r)} | {ms:.2f} | `{kernel_label(name)}` |")
    return "\n".join(lines) + "\n"


def time_ms(fn, reps: int) -> float:
    """Median CUDA-event time of ``fn()`` over ``reps`` calls, each synchronized."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def write_report(table: str, meta: dict, rows: list[dict], json_path: str | None, markdown_path: str | None) -> None:
    """Prints an end-to-end benchmark's markdown table and writes it and the raw rows if asked."""
    print(table)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=1)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(table)

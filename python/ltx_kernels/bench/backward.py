"""Forward + backward per op: ``python -m ltx_kernels.bench.backward``.

Times one training step of each op with a backward (the forward, then the gradients of every
input and weight for random output gradients) at the ops benchmark's shapes, against the
plain PyTorch formula HF models run (eager), torch.compile of it and Liger-Kernel where it has
the op. Inputs are [rows, hidden] (swiglu and geglu: [rows, 2 * hidden]). Before timing, each
case's outputs and gradients are checked against eager's in fp64.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, NamedTuple

import torch

import ltx_kernels
from ltx_kernels.bench import elementwise, harness, norm
from ltx_kernels.bench.__main__ import IMPLS, SHAPES

EPS = 1e-6
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Op(NamedTuple):
    ours: Callable
    eager: Callable
    shapes: Callable[[int, int], list[tuple[int, ...]]]  # (rows, hidden) -> the inputs' shapes
    # The bytes a fused forward + backward must move, in [rows, hidden] tensors and [hidden]
    # vectors: forward, the inputs read and outputs written; backward, the outputs' gradients
    # and saved inputs read and the inputs' gradients written (fused_add_rms_norm: x and
    # residual get one gradient; per-row statistics are left out).
    tensors: int
    vectors: int = 0


def _pair(rows, d):
    return [(rows, d), (rows, d)]


def _concatenated(rows, d):
    return [(rows, 2 * d)]


OPS = {
    "rms_norm": Op(lambda x, w: ltx_kernels.rms_norm(x, w, EPS), lambda x, w: norm.eager_rms_norm(x, w, EPS),
                   lambda rows, d: [(rows, d), (d,)], 5, 3),
    "fused_add_rms_norm": Op(lambda x, r, w: ltx_kernels.fused_add_rms_norm(x, r, w, EPS),
                             lambda x, r, w: norm.eager_fused_add_rms_norm(x, r, w, EPS),
                             lambda rows, d: [(rows, d), (rows, d), (d,)], 8, 3),
    "layer_norm": Op(lambda x, w, b: ltx_kernels.layer_norm(x, w, b, EPS),
                     lambda x, w, b: norm.eager_layer_norm(x, w, b, EPS),
                     lambda rows, d: [(rows, d), (d,), (d,)], 5, 5),
    "silu_and_mul": Op(ltx_kernels.silu_and_mul, elementwise.eager_silu_and_mul, _pair, 8),
    "gelu_tanh_and_mul": Op(ltx_kernels.gelu_tanh_and_mul, elementwise.eager_gelu_tanh_and_mul, _pair, 8),
    "swiglu": Op(ltx_kernels.swiglu, elementwise.eager_swiglu, _concatenated, 8),
    "geglu": Op(lambda x: ltx_kernels.geglu(x, approximate="tanh"),
                lambda x: elementwise.eager_gelu_tanh_and_mul(*x.chunk(2, -1)), _concatenated, 8),
    "gelu_tanh": Op(ltx_kernels.gelu_tanh, elementwise.eager_gelu_tanh, lambda rows, d: [(rows, d)], 5),
}

# op: (Liger-Kernel module, its autograd function, the arguments after the tensors).
LIGER = {
    "rms_norm": ("rms_norm", "LigerRMSNormFunction", (EPS,)),
    "fused_add_rms_norm": ("fused_add_rms_norm", "LigerFusedAddRMSNormFunction", (EPS,)),
    "layer_norm": ("layer_norm", "LigerLayerNormFunction", (EPS,)),
    "silu_and_mul": ("swiglu", "LigerSiLUMulFunction", ()),
    "gelu_tanh_and_mul": ("geglu", "LigerGELUMulFunction", ()),
    "swiglu": ("swiglu", "LigerFusedGateUpSiLUMulFunction", ()),
}


def _liger() -> dict[str, Callable]:
    """Liger-Kernel's implementation of each op the installed version has; {} when it is not
    installed. From the package when it exports the function (recent versions put the device's
    implementation there), else from its module (older versions export nothing)."""
    try:
        package = importlib.import_module("liger_kernel.ops")
    except ImportError:
        return {}
    found = {}
    for op, (module, name, args) in LIGER.items():
        try:
            fn = getattr(package, name, None) or getattr(importlib.import_module(f"liger_kernel.ops.{module}"), name)
        except (ImportError, AttributeError):
            continue
        found[op] = lambda *tensors, fn=fn, args=args: fn.apply(*tensors, *args)
    return found


def _outputs(fn, inputs) -> tuple[torch.Tensor, ...]:
    out = fn(*inputs)
    return out if isinstance(out, tuple) else (out,)


def step(fn, inputs, grads) -> Callable[[], tuple[torch.Tensor, ...]]:
    """One timed call: the forward, then every input's gradient. autograd.grad returns them
    rather than accumulating into ``.grad``: accumulation copies a gradient that two leaves
    share (x and residual of fused_add_rms_norm), a kernel no training step runs."""
    return lambda: torch.autograd.grad(_outputs(fn, inputs), inputs, grads)


def max_error(ours, eager, inputs, grads) -> float:
    """Largest relative L2 error of ours' outputs and gradients against eager's on the same
    inputs in fp64 (eager_rms_norm computes in fp32 there, as HF's formula does)."""
    copies = [t.detach().double().requires_grad_() for t in inputs]
    expected = _outputs(eager, copies)
    expected += torch.autograd.grad(expected, copies, [g.double() for g in grads])
    got = _outputs(ours, inputs)
    got += torch.autograd.grad(got, inputs, grads)
    return max(harness.rel_err(a, b) for a, b in zip(got, expected))


def cases(shapes, ops, dtype=torch.bfloat16, liger=None, device="cuda") -> list[harness.Case]:
    """Each op of ``ops`` at each (label, rows, hidden) of ``shapes``; ``liger`` as _liger()."""
    liger = liger or {}
    out = []
    for op in ops:
        spec = OPS[op]
        # Specialized to each shape (a training run's shapes are fixed), not one dynamic graph.
        compiled = torch.compile(spec.eager, dynamic=False)
        for label, rows, d in shapes:
            inputs = [torch.randn(s, device=device, dtype=dtype).requires_grad_() for s in spec.shapes(rows, d)]
            with torch.no_grad():
                grads = [torch.randn_like(o) for o in _outputs(spec.ours, inputs)]
            impls = {"ltx_kernels": step(spec.ours, inputs, grads), "eager": step(spec.eager, inputs, grads),
                     "compile": step(compiled, inputs, grads)}
            if op in liger:
                # Last (run_cases times in this order): Liger's backward writes gradients over
                # its inputs or the output gradient to save memory, which the others share.
                impls["liger"] = step(liger[op], inputs, grads)
            size = dtype.itemsize
            out.append(harness.Case(op, label, (spec.tensors * rows * d + spec.vectors * d) * size, impls,
                                    lambda ours=spec.ours, eager=spec.eager, inputs=inputs, grads=grads:
                                    max_error(ours, eager, inputs, grads)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.backward", description=__doc__)
    parser.add_argument("--json", help="write results to this JSON file")
    parser.add_argument("--markdown", help="write the table to this markdown file")
    parser.add_argument("--ops", nargs="*", choices=list(OPS), help="only these ops (default: all)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("python -m ltx_kernels.bench.backward")

    liger = _liger()
    if not liger:
        print("Liger-Kernel is not installed: no liger column", file=sys.stderr)
    copy_gbs = harness.copy_bandwidth_gbs()
    meta = {**harness.device_meta(copy_gbs), "dtype": args.dtype}
    print(f"{meta['gpu']}: device-to-device copy {copy_gbs:.0f} GB/s (read + write)")
    results = harness.run_cases(cases(SHAPES, args.ops or list(OPS), DTYPES[args.dtype], liger), copy_gbs)
    harness.write_ops_report(results, IMPLS, meta, copy_gbs,
                             f"{args.dtype}, us per forward + backward (% of copy bandwidth for the bytes a fused "
                             "forward + backward moves): median GPU time, L2 flushed, host launch overhead excluded; "
                             "ours' outputs and gradients checked against eager's in fp64 first.",
                             args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

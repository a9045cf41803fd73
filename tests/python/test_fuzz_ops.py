"""Property-based fuzz of the ops (issue 19), through torch.ops.ltx_kernels as a user calling
them directly would, with hypothesis (derandomized: the same cases on every run).

Valid calls (odd sizes, zero rows, every dtype, strided, non-collapsible and row-broadcast
layouts of every tensor argument; the backward ops with gradients as autograd passes them)
must match the plain-torch formula in fp64, on the CPU and
(when there is one) the GPU, and the Meta implementation must give the same shapes, dtypes and strides. Invalid calls (one tensor argument
broken: wrong dtype, wrong size, a strided or expanded last dim, a 0-dim tensor, another
device) must raise TypeError or ValueError naming the argument, on the CPU, Meta and CUDA alike.
A crash (segfault) fails the run. FUZZ_EXAMPLES sets the cases per op and kind (CI default;
a long run: FUZZ_EXAMPLES=2000). FUZZ_SEED=<n> draws another set of cases from that seed (a
held-out run: cases no one tuned the ops against), still reproducible.
"""

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F

from conftest import DTYPES, HAS_CUDA, TOLERANCE, RoundedGradient, activation_scale, assert_close
from test_elementwise import gelu_formula, gelu_tanh_formula, silu_formula
from test_fp8 import fp8_accumulator_error, torch_quantize
from test_group_norm import formula as group_norm_formula
from test_linear_gelu_tanh import fp32_tanh_form
from test_layer_norm import layer_norm_formula
from test_rms_norm import rms_norm_formula
from test_rope import llm_rope_formula, ltx_rope_formula, ltx_tables_fp64, rms_formula

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ops = torch.ops.ltx_kernels
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))  # x 30 builders x 2 kinds: >= 6,000 cases
SEED = os.environ.get("FUZZ_SEED")
SETTINGS = settings(max_examples=EXAMPLES, derandomize=SEED is None, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
SIZES = [1, 2, 7, 16, 33, 64, 130]


@dataclass
class Arg:
    """A tensor argument: its name (as the op's schema says), its tensor, and whether the op
    documents copying it to a contiguous tensor (per-channel weight and bias vectors: any
    layout is then valid)."""

    name: str
    tensor: torch.Tensor
    copied: bool = False
    valid_breaks: tuple = ()  # breaks (BREAKS below) that the op accepts for this argument


@dataclass
class Call:
    op: str
    args: list  # Arg or plain values, in the schema's order
    kwargs: dict = field(default_factory=dict)
    # Tolerance scale (conftest.assert_close): two roundings to dtype on the fused paths (h,
    # then the output); a GEMM's summation order in fp32 needs more.
    scale: float = 2.0
    exact: bool = False  # the formula gives the output bit for bit (the FP8 format)
    # Outside the CUDA kernel's documented domain (attention on CUDA: bf16 or fp16, head_dim 64
    # or 128): on the GPU the call must raise a clear error naming the op, not run.
    cuda_refuses: bool = False
    cuda_scale: float | None = None  # the GPU's tolerance scale where it differs from the CPU's
    cuda_formula: Callable | None = None  # the GPU's reference where its documented method differs from the CPU's
    out_scales: list | None = None  # per output, where they differ (set by a backward op's formula)
    out_dtype: torch.dtype | None = None  # the output's dtype where it is not the inputs' (rms_norm's out_dtype)
    out_dtypes: list | None = None  # per output, where they differ (a backward op: each argument's dtype)

    def run(self, device=None):
        def move(a):
            t = a.tensor if isinstance(a, Arg) else a
            if device is None or not isinstance(t, torch.Tensor):
                return t
            # Keeps the strides and the storage offset: a strided, expanded or offset view stays
            # one on the other device (its whole storage moves, then the view is taken again).
            if device == "meta":
                return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
            storage = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
            return storage.to(device).as_strided(t.size(), t.stride(), t.storage_offset())

        out = getattr(ops, self.op)(*[move(a) for a in self.args], **{k: move(v) for k, v in self.kwargs.items()})
        return out

    def tensors(self):
        return [a for a in self.args if isinstance(a, Arg) and a.tensor is not None]


def laid_out(draw, t: torch.Tensor) -> torch.Tensor:
    """t's values in one of the layouts a caller may pass: as is, rows that are a slice of a
    wider tensor, or (3 dims) leading dims that do not collapse into one row stride."""
    layout = draw(st.sampled_from(["contiguous", "row_strided", "non_collapsible"]))
    if layout == "row_strided" and t.dim() >= 2:
        wide = torch.empty(*t.shape[:-1], t.shape[-1] + 5, dtype=t.dtype)
        wide[..., 3:3 + t.shape[-1]] = t
        return wide[..., 3:3 + t.shape[-1]]
    if layout == "non_collapsible" and t.dim() == 3:
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    return t


def rows_shape(draw, d):
    lead = draw(st.sampled_from([(), (0,), (1,), (3,), (2, 3), (1, 4), (3, 1), (2, 0)]))
    return (*lead, d) if lead else (draw(st.sampled_from([1, 2, 5])), d)


def randn(shape, dtype):
    return torch.randn(shape).to(dtype)


def per_row_vector(draw, x_shape, dtype, name):
    """scale / shift / gate: [D], [B, 1, D] (per batch, 3-dim x) or per token (x's shape)."""
    d = x_shape[-1]
    kinds = ["vector", "per_token"] + (["per_batch"] if len(x_shape) == 3 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "vector":
        return Arg(name, randn((d,), dtype))
    if kind == "per_batch":
        return Arg(name, laid_out(draw, randn((x_shape[0], 1, d), dtype)))
    return Arg(name, laid_out(draw, randn(x_shape, dtype)))


def optional(draw, make):
    return make() if draw(st.booleans()) else None


def params_dtype(draw, dtype):
    """The dtype of a norm's weight and bias: x's, or float32 beside a 16-bit x (mixed
    precision, where the op takes it)."""
    return dtype if dtype == torch.float32 else draw(st.sampled_from([dtype, torch.float32]))


# Each builder draws a valid call and returns it with its fp64 formula.


def build_rms_norm(draw, dtype):
    shape = rows_shape(draw, draw(st.sampled_from(SIZES)))
    x = Arg("x", laid_out(draw, randn(shape, dtype)))
    w = optional(draw, lambda: randn((shape[-1],), params_dtype(draw, dtype)))
    offset = draw(st.sampled_from([0.0, 1.0]))
    out_dtype = draw(st.sampled_from([None, torch.float32]))
    call = Call("rms_norm", [x, Arg("weight", w, copied=True), 1e-6, offset], {"out_dtype": out_dtype},
                out_dtype=out_dtype)
    return call, lambda: rms_norm_formula(x.tensor, w, 1e-6, offset)


def build_layer_norm(draw, dtype):
    shape = rows_shape(draw, draw(st.sampled_from(SIZES)))
    x = Arg("x", laid_out(draw, randn(shape, dtype)))
    w = optional(draw, lambda: randn((shape[-1],), params_dtype(draw, dtype)))
    b = optional(draw, lambda: randn((shape[-1],), params_dtype(draw, dtype)))
    call = Call("layer_norm", [x, Arg("weight", w, copied=True), Arg("bias", b, copied=True), 1e-5])
    return call, lambda: layer_norm_formula(x.tensor, w, b, 1e-5)


def build_fused_add_rms_norm(draw, dtype):
    shape = rows_shape(draw, draw(st.sampled_from(SIZES)))
    x = Arg("x", laid_out(draw, randn(shape, dtype)))
    residual = Arg("residual", laid_out(draw, randn(shape, dtype)))
    w = optional(draw, lambda: randn((shape[-1],), params_dtype(draw, dtype)))

    def formula():
        h = (x.tensor.double() + residual.tensor.double()).to(dtype)
        return rms_norm_formula(h, w, 1e-6), h

    return Call("fused_add_rms_norm", [x, residual, Arg("weight", w, copied=True), 1e-6]), formula


def build_adaln(draw, dtype, layer):
    shape = rows_shape(draw, draw(st.sampled_from(SIZES)))
    x = Arg("x", laid_out(draw, randn(shape, dtype)))
    scale, shift = per_row_vector(draw, shape, dtype, "scale"), per_row_vector(draw, shape, dtype, "shift")
    w = optional(draw, lambda: randn((shape[-1],), dtype))
    if layer:
        b = optional(draw, lambda: randn((shape[-1],), dtype))
        call = Call("adaln_layer_norm", [x, scale, shift, Arg("weight", w, copied=True), Arg("bias", b, copied=True),
                                         1e-6])
        normed = lambda: layer_norm_formula(x.tensor, w, b, 1e-6)  # noqa: E731
    else:
        call = Call("adaln_rms_norm", [x, scale, shift, Arg("weight", w, copied=True), 1e-6])
        normed = lambda: rms_norm_formula(x.tensor, w, 1e-6)  # noqa: E731
    return call, lambda: normed() * (1 + scale.tensor.double()) + shift.tensor.double()


def build_gated_residual_adaln_rms_norm(draw, dtype):
    shape = rows_shape(draw, draw(st.sampled_from(SIZES)))
    x = Arg("x", laid_out(draw, randn(shape, dtype)))
    y = Arg("y", laid_out(draw, randn(shape, dtype)))
    gate = per_row_vector(draw, shape, dtype, "gate") if draw(st.booleans()) else Arg("gate", None)
    scale, shift = per_row_vector(draw, shape, dtype, "scale"), per_row_vector(draw, shape, dtype, "shift")
    w = optional(draw, lambda: randn((shape[-1],), dtype))

    def formula():
        g = 1.0 if gate.tensor is None else gate.tensor.double()
        x_new = (x.tensor.double() + y.tensor.double() * g).to(dtype)
        normed = rms_norm_formula(x_new, w, 1e-6) * (1 + scale.tensor.double()) + shift.tensor.double()
        return x_new, normed

    call = Call("gated_residual_adaln_rms_norm", [x, y, gate, scale, shift, Arg("weight", w, copied=True), 1e-6])
    return call, formula


def build_gated_residual(draw, dtype):
    shape = rows_shape(draw, draw(st.sampled_from(SIZES)))
    x = Arg("x", laid_out(draw, randn(shape, dtype)))
    y = Arg("y", laid_out(draw, randn(shape, dtype)))
    gate = per_row_vector(draw, shape, dtype, "gate") if draw(st.booleans()) else Arg("gate", None)
    g = lambda: 1.0 if gate.tensor is None else gate.tensor.double()  # noqa: E731
    return Call("gated_residual", [x, y, gate]), lambda: x.tensor.double() + y.tensor.double() * g()


def build_activation(draw, dtype):
    shape = rows_shape(draw, draw(st.sampled_from(SIZES)))
    x = Arg("x", laid_out(draw, randn(shape, dtype) * 3))
    return Call("gelu_tanh", [x], scale=2 * activation_scale(dtype)), lambda: gelu_tanh_formula(x.tensor)


def build_and_mul(draw, dtype):
    op, act = draw(st.sampled_from([("gelu_tanh_and_mul", gelu_tanh_formula), ("gelu_and_mul", gelu_formula),
                                    ("silu_and_mul", silu_formula)]))
    shape = rows_shape(draw, draw(st.sampled_from(SIZES)))
    a = Arg("a", laid_out(draw, randn(shape, dtype) * 3))
    b = Arg("b", laid_out(draw, randn(shape, dtype)))
    return Call(op, [a, b], scale=2 * activation_scale(dtype)), lambda: act(a.tensor) * b.tensor.double()


def build_glu(draw, dtype):
    op, approximate = draw(st.sampled_from([("geglu", "tanh"), ("geglu", "none"), ("swiglu", None)]))
    shape = rows_shape(draw, 2 * draw(st.sampled_from(SIZES)))
    x = Arg("x", laid_out(draw, randn(shape, dtype) * 3))
    act = silu_formula if op == "swiglu" else gelu_tanh_formula if approximate == "tanh" else gelu_formula
    h = shape[-1] // 2
    call = Call(op, [x] + ([approximate] if op == "geglu" else []), scale=2 * activation_scale(dtype))
    return call, lambda: act(x.tensor[..., :h]) * x.tensor[..., h:].double()


def build_linear_gelu_tanh(draw, dtype):
    k, n = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES))
    shape = rows_shape(draw, k)
    x = Arg("x", laid_out(draw, randn(shape, dtype)))
    w = Arg("weight", laid_out(draw, randn((n, k), dtype) / math.sqrt(k)), copied=True)  # any layout: a GEMM operand
    b = Arg("bias", randn((n,), dtype), copied=True)
    call = Call("linear_gelu_tanh", [x, w, b], scale=10.0 if dtype == torch.float32 else 2.0,
                cuda_formula=None if dtype == torch.float32 else (
                    lambda: fp32_tanh_form(x.tensor.double() @ w.tensor.double().T + b.tensor.double())))

    def formula():
        # h rounded to the dtype (its gradient passed through) as the CPU path and the backward
        # compute it (the 16-bit CUDA path's GELU reads h in fp32: cuda_formula), and h's
        # gradient rounded to the dtype before the GEMMs and the bias sum, as the backward op
        # (like torch's autograd of Linear + GELU) computes it.
        h = x.tensor.double() @ w.tensor.double().T + b.tensor.double()
        return gelu_tanh_formula(RoundedGradient.apply(h + (h.to(dtype).double() - h).detach(), dtype))
    return call, formula


def build_quantize_fp8(draw, dtype):
    shape = rows_shape(draw, draw(st.sampled_from(SIZES)))
    x = Arg("x", laid_out(draw, randn(shape, dtype)))
    return Call("quantize_fp8", [x, "none"], exact=True), lambda: torch_quantize(x.tensor)


def build_apply_rotary_pos_emb(draw, dtype):
    b, s, dh = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 3, 5])), draw(st.sampled_from([2, 6, 8, 10, 64]))
    r = draw(st.sampled_from(sorted({dh, max(2, dh // 2 // 2 * 2)})))  # full or partial rotary
    hq, hk = draw(st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3)]))
    bhsd = draw(st.booleans())
    shape = (lambda h: (b, h, s, dh)) if bhsd else (lambda h: (b, s, h, dh))
    q, k = Arg("q", laid_out(draw, randn(shape(hq), dtype))), Arg("k", laid_out(draw, randn(shape(hk), dtype)))
    table_dtype = draw(st.sampled_from([dtype, torch.float32]))
    angles = torch.randn(b if draw(st.booleans()) else 1, s, r // 2, dtype=torch.float64) * 20
    emb = torch.cat((angles, angles), -1)
    cos, sin = Arg("cos", emb.cos().to(table_dtype)), Arg("sin", emb.sin().to(table_dtype))
    interleaved, unsqueeze_dim = draw(st.booleans()), 1 if bhsd else 2
    call = Call("apply_rotary_pos_emb", [q, k, cos, sin, interleaved, unsqueeze_dim])
    return call, lambda: tuple(llm_rope_formula(t.tensor, cos.tensor, sin.tensor, unsqueeze_dim, interleaved)
                               for t in (q, k))


def ltx_grid(draw):
    grid = draw(st.sampled_from([(1, 1, 1), (1, 2, 3), (2, 2, 2), (3, 1, 2)]))
    return grid, grid[0] * grid[1] * grid[2]


def build_ltx_rope(draw, dtype):
    b, d = draw(st.sampled_from([1, 2])), draw(st.sampled_from([6, 12, 16, 64]))  # diffusers' tables: pairs
    grid, s = ltx_grid(draw)
    x = Arg("x", laid_out(draw, randn((b, s, d), dtype)))
    cos64, sin64 = ltx_tables_fp64(b, s, d, grid, (1.0, 1.0, 1.0))
    table_dtype = draw(st.sampled_from([dtype, torch.float32]))
    cos, sin = Arg("cos", laid_out(draw, cos64.to(table_dtype))), Arg("sin", laid_out(draw, sin64.to(table_dtype)))
    return Call("ltx_rope", [x, cos, sin]), lambda: ltx_rope_formula(x.tensor, cos.tensor.double(), sin.tensor.double())


def build_ltx_qk_norm_rope(draw, dtype):
    b, d = draw(st.sampled_from([1, 2])), draw(st.sampled_from([6, 7, 12, 16, 64]))
    grid, s = ltx_grid(draw)
    q, k = Arg("q", laid_out(draw, randn((b, s, d), dtype))), Arg("k", laid_out(draw, randn((b, s, d), dtype)))
    wq = Arg("weight_q", optional(draw, lambda: randn((d,), dtype)), copied=True)
    wk = Arg("weight_k", optional(draw, lambda: randn((d,), dtype)), copied=True)
    axis_scale = draw(st.sampled_from([(1.0, 1.0, 1.0), (0.016, 0.0156, 0.0156)]))
    cos, sin = ltx_tables_fp64(b, s, d, grid, axis_scale)
    call = Call("ltx_qk_norm_rope", [q, k, wq, wk, 1e-6, list(grid), list(axis_scale), Arg("video_coords", None),
                                     10000.0])
    return call, lambda: tuple(ltx_rope_formula(rms_formula(t.tensor, w.tensor, 1e-6), cos, sin)
                               for t, w in ((q, wq), (k, wk)))


def build_attention(draw, dtype):
    b, hkv, groups = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    sq, sk, d = draw(st.sampled_from([1, 3, 9])), draw(st.sampled_from([1, 4, 7])), draw(st.sampled_from([4, 16, 64]))
    q = Arg("q", laid_out(draw, randn((b, hkv * groups, sq, d), dtype)))
    k, v = Arg("k", laid_out(draw, randn((b, hkv, sk, d), dtype))), Arg("v", laid_out(draw, randn((b, hkv, sk, d), dtype)))
    mask = None
    if draw(st.booleans()):  # a key padding mask (bool) or an additive one (floating)
        keep = torch.rand(b, 1, 1, sk) > 0.3
        mask = keep if draw(st.booleans()) else torch.where(keep, 0.0, -math.inf).to(dtype)
    # The mask is converted to fp32 by the op: any floating dtype, any layout, 0 dims broadcast.
    m = Arg("attn_mask", mask, valid_breaks=("float64", "strided_last_dim", "expanded_last_dim", "zero_dim"))

    def formula():
        qd, kd, vd = (t.tensor.double().repeat_interleave(groups, 1) if t is not q else t.tensor.double()
                      for t in (q, k, v))
        scores = qd @ kd.transpose(-1, -2) / math.sqrt(d)
        if mask is not None:
            scores = scores + (torch.where(mask, 0.0, -math.inf) if mask.dtype == torch.bool else m.tensor.double())
        # A query whose keys are all masked: zeros, and zero gradients (no NaN for autograd to carry).
        dead = (scores == -math.inf).all(-1, keepdim=True)
        p = torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
        return p @ vd

    cuda_refuses = dtype == torch.float32 or d not in (64, 128)
    return Call("attention", [q, k, v, m, None, "bf16"], cuda_refuses=cuda_refuses), formula


def build_fp8_linear(draw, dtype):
    k, n = draw(st.sampled_from([16, 32, 48])), draw(st.sampled_from([16, 32, 64]))
    shape = rows_shape(draw, k)
    xq, xs = torch_quantize(randn(shape, dtype))
    wq, ws = torch_quantize(randn((n, k), dtype))
    bias = optional(draw, lambda: randn((n,), dtype))
    # GEMM operands and their scales: any layout (the op copies them to contiguous ones).
    x = Arg("x", laid_out(draw, xq), copied=True)
    # On the GPU the tensor cores' FP8 accumulator is coarser than an fp32 output's rounding.
    cuda_scale = max(2.0, fp8_accumulator_error(k) / TOLERANCE[dtype])
    call = Call("fp8_linear", [x, Arg("x_scale", xs, copied=True), Arg("weight", wq, copied=True),
                               Arg("weight_scale", ws, copied=True), Arg("bias", bias, copied=True), dtype],
                cuda_scale=cuda_scale)

    def formula():
        out = (xq.double() * xs.double()[..., None]) @ (wq.double() * ws.double()[:, None]).T
        return out + bias.double() if bias is not None else out

    return call, formula


def build_fp8_linear_gated_residual(draw, dtype):
    k, n = draw(st.sampled_from([16, 32, 48])), draw(st.sampled_from([16, 32, 64]))
    b, s = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([0, 1, 5, 7]))
    xq, xs = torch_quantize(randn((b, s, k), dtype))
    wq, ws = torch_quantize(randn((n, k), dtype))
    bias = optional(draw, lambda: randn((n,), dtype))
    residual = randn((b, s, n), dtype)
    gate = laid_out(draw, randn((b, 1, n), dtype)) if draw(st.booleans()) else randn((n,), dtype)
    # x, the scales and vectors, the residual and the gate: any layout (the op copies them).
    x = Arg("x", laid_out(draw, xq), copied=True)
    # The GPU's FP8 accumulator error, relative to the linear's output, times the gate.
    cuda_scale = max(2.0, 4 * fp8_accumulator_error(k) / TOLERANCE[dtype])
    call = Call("fp8_linear_gated_residual",
                [x, Arg("x_scale", xs, copied=True), Arg("weight", wq, copied=True),
                 Arg("weight_scale", ws, copied=True), Arg("bias", bias, copied=True),
                 Arg("residual", laid_out(draw, residual), copied=True), Arg("gate", gate, copied=True)],
                cuda_scale=cuda_scale)

    def formula():
        out = (xq.double() * xs.double()[..., None]) @ (wq.double() * ws.double()[:, None]).T
        out = out + bias.double() if bias is not None else out
        return residual.double() + gate.double() * out

    return call, formula


def build_linear_gated_residual(draw, dtype):
    """x [B, S, K], weight [N, K], residual [B, S, N] in any layout (copied where the kernel
    cannot read them), an optional bias, a gate per batch, per channel or none; K and N odd or
    not (the Hopper kernel takes multiples of 8, the fallback the rest)."""
    k, n = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES))
    b, s = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([0, 1, 5, 7]))
    x = Arg("x", laid_out(draw, randn((b, s, k), dtype)), copied=True)
    w = Arg("weight", laid_out(draw, randn((n, k), dtype) / math.sqrt(k)), copied=True)
    bias = Arg("bias", optional(draw, lambda: randn((n,), dtype)), copied=True)
    residual = Arg("residual", laid_out(draw, randn((b, s, n), dtype)), copied=True)
    kind = draw(st.sampled_from(["batch", "vector", None]))
    gate = Arg("gate", None if kind is None else laid_out(draw, randn((b, 1, n), dtype)) if kind == "batch"
               else randn((n,), dtype), copied=True)
    call = Call("linear_gated_residual", [x, w, bias, residual, gate], scale=10.0 if dtype == torch.float32 else 2.0)

    def formula():
        y = x.tensor.double() @ w.tensor.double().T + (0.0 if bias.tensor is None else bias.tensor.double())
        # y's gradient, gate * grad_out, rounded to dtype before the GEMMs (as the backward op,
        # like autograd of the unfused linear, computes it).
        y = RoundedGradient.apply(y, dtype)
        return residual.tensor.double() + (y if gate.tensor is None else gate.tensor.double() * y)

    return call, formula


def build_glu_linear(draw, dtype):
    """a, b [..., K] in any layout the activation op reads, weight [N, K] in any (a GEMM
    operand), an optional bias; each activation."""
    activation, act = draw(st.sampled_from([("silu", silu_formula), ("gelu_tanh", gelu_tanh_formula),
                                            ("gelu", gelu_formula)]))
    k, n = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES))
    shape = rows_shape(draw, k)
    a = Arg("a", laid_out(draw, randn(shape, dtype) * 3))
    b = Arg("b", laid_out(draw, randn(shape, dtype)))
    w = Arg("weight", laid_out(draw, randn((n, k), dtype) / math.sqrt(k)), copied=True)
    bias = Arg("bias", optional(draw, lambda: randn((n,), dtype)), copied=True)
    call = Call("glu_linear", [a, b, w, bias, activation],
                scale=(5.0 if dtype == torch.float32 else 2.0) * activation_scale(dtype))

    def formula():
        # The activation rounded to dtype as the forward stores it (its gradient passed
        # through), its gradient rounded to dtype before the activation's backward.
        h = act(a.tensor) * b.tensor.double()
        h = RoundedGradient.apply(h + (h.to(dtype).double() - h).detach(), dtype)
        return h @ w.tensor.double().T + (0.0 if bias.tensor is None else bias.tensor.double())

    return call, formula


def build_fused_linear_cross_entropy(draw, dtype):
    """An LLM head's loss: x [..., hidden] in any layout (the GEMM's operand), weight [vocab,
    hidden], int64 targets with some ignored (any layout), an optional bias, each reduction;
    both outputs (the loss and each token's log-sum-exp) in fp32, so fp32's tolerance."""
    k, vocab = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES))
    shape = rows_shape(draw, k)
    x = Arg("x", laid_out(draw, randn(shape, dtype)), valid_breaks=("strided_last_dim", "expanded_last_dim"))
    w = Arg("weight", laid_out(draw, randn((vocab, k), dtype) / math.sqrt(k)), copied=True)
    target = torch.randint(0, vocab, shape[:-1])
    target = target.where(torch.rand(shape[:-1]) > 0.25, -100)
    if target.numel():
        target.view(-1)[0] = 0  # a mean over no target is NaN (0 / 0), as torch's
    t = Arg("target", target, valid_breaks=("strided_last_dim", "expanded_last_dim"))
    b = Arg("bias", randn((vocab,), dtype) if draw(st.booleans()) else None, copied=True)
    reduction = draw(st.sampled_from(["mean", "sum", "none"] if target.numel() else ["sum", "none"]))
    call = Call("fused_linear_cross_entropy", [x, w, t, b, -100, reduction], scale=10.0,
                out_dtypes=[torch.float32, torch.float32])

    def formula():
        logits = x.tensor.double() @ w.tensor.double().T + (0.0 if b.tensor is None else b.tensor.double())
        flat = logits.reshape(-1, vocab)
        loss = F.cross_entropy(flat, target.reshape(-1), ignore_index=-100, reduction=reduction)
        return (loss.reshape(target.shape) if reduction == "none" else loss), torch.logsumexp(logits, -1)

    return call, formula


def build_group_norm(draw, dtype):
    """x [N, C, *spatial] contiguous, channels last or in another layout (copied: any layout is
    valid, and so is any spatial shape), per-channel weight / bias, a [N, C] add, SiLU or not.
    Groups of >= 3 elements and, with add, >= 2 channels: otherwise the backward's gradients are
    rounding noise around 0 (test_group_norm.test_backward)."""
    n = draw(st.sampled_from([0, 1, 2, 3]))
    spatial = draw(st.sampled_from([(), (3,), (5, 3), (7, 4), (3, 3, 5), (0, 3)]))
    groups = draw(st.sampled_from([1, 2, 3]))
    with_add = draw(st.booleans())
    per_group = draw(st.sampled_from([3, 5] if not spatial else [2, 3, 5] if with_add else [1, 2, 3, 5]))
    x_t = randn((n, groups * per_group, *spatial), dtype)
    layout = draw(st.sampled_from(["contiguous", "channels_last", "transposed"]))
    if layout == "channels_last":
        x_t = x_t.movedim(1, -1).contiguous().movedim(-1, 1)
    elif layout == "transposed" and x_t.dim() >= 3:
        x_t = x_t.transpose(0, -1).contiguous().transpose(0, -1)
    x = Arg("x", x_t, copied=True,
            valid_breaks=("wider_last_dim", "strided_last_dim", "expanded_last_dim") if spatial else ())
    c = x_t.shape[1]
    pd = params_dtype(draw, dtype)
    w = optional(draw, lambda: randn((c,), pd))
    b = optional(draw, lambda: randn((c,), pd))
    add = randn((n, c), dtype) if with_add else None
    silu = draw(st.booleans())
    call = Call("group_norm", [x, groups, Arg("weight", w, copied=True), Arg("bias", b, copied=True), 1e-5,
                               Arg("add", add, copied=True), silu])
    return call, lambda: group_norm_formula(x.tensor, groups, w, b, 1e-5, add, silu)


BUILDERS = {
    "apply_rotary_pos_emb": build_apply_rotary_pos_emb,
    "fused_linear_cross_entropy": build_fused_linear_cross_entropy,
    "ltx_rope": build_ltx_rope,
    "ltx_qk_norm_rope": build_ltx_qk_norm_rope,
    "attention": build_attention,
    "fp8_linear": build_fp8_linear,
    "fp8_linear_gated_residual": build_fp8_linear_gated_residual,
    "rms_norm": build_rms_norm,
    "layer_norm": build_layer_norm,
    "fused_add_rms_norm": build_fused_add_rms_norm,
    "adaln_rms_norm": lambda draw, dtype: build_adaln(draw, dtype, layer=False),
    "adaln_layer_norm": lambda draw, dtype: build_adaln(draw, dtype, layer=True),
    "gated_residual_adaln_rms_norm": build_gated_residual_adaln_rms_norm,
    "gated_residual": build_gated_residual,
    "gelu_tanh": build_activation,
    "and_mul": build_and_mul,
    "glu": build_glu,
    "group_norm": build_group_norm,
    "linear_gelu_tanh": build_linear_gelu_tanh,
    "linear_gated_residual": build_linear_gated_residual,
    "glu_linear": build_glu_linear,
    "quantize_fp8": build_quantize_fp8,
}


# Row parts of the output gradients whose backward results measure a gradient's cancellation.
MAGNITUDE_PARTS = 16


def row_parts(cotangents, parts):
    """The cotangents in `parts` pieces by row (each tensor's leading dims flattened), each piece
    every cotangent with the other rows zeroed: the pieces sum to the cotangents."""
    for k in range(parts):
        piece = []
        for c in cotangents:
            if c.dim() == 0 or c.shape[-1] == 0:
                piece.append(c if k == 0 else torch.zeros_like(c))
                continue
            rows = c.numel() // c.shape[-1]
            row = torch.arange(rows).reshape(*c.shape[:-1], 1)
            piece.append(c * (row * parts // max(rows, 1) == k))
        yield piece


def cancellation(grad, squares):
    """How much the gradient's row parts (their squares summed: `squares`) outweigh the
    gradient itself: >= 1, and 1 where its parts do not cancel."""
    if squares is None or grad.numel() == 0:
        return 1.0
    norm = grad.norm().item()
    return max(1.0, squares.sum().sqrt().item() / norm) if norm > 0 else 1.0


def build_backward(draw, dtype, forward):
    """The backward op of a forward call as autograd calls it: random gradients of the outputs
    (in any layout autograd may pass: dense, strided, expanded), then the forward's arguments.
    Its formula is autograd of the forward's fp64 formula (a rounding to dtype passes the
    gradient through): one gradient per tensor argument, in that argument's dtype, an empty
    tensor for an absent optional one; none for an argument whose gradient is another one
    (gradient_is in schemas.cpp: the schema returns no ``grad_<argument>`` for it)."""
    call, formula = forward(draw, dtype)
    returns = [r.name for r in getattr(torch.ops.ltx_kernels, f"{call.op}_backward").default._schema.returns]
    # A norm of one or two channels maps each row to constants: its x gradient is rounding
    # noise (test_backward.NORM_SIZES), nothing to compare.
    hypothesis.assume("norm" not in call.op or call.args[0].tensor.shape[-1] >= 3)
    outs = call.run()
    outs = outs if isinstance(outs, tuple) else (outs,)
    saves_outputs = call.op in SAVED_OUTPUTS  # its backward takes outputs too, after the arguments
    grads = [Arg(name, laid_out(draw, randn(o.shape, o.dtype)), copied=call.op == "fused_linear_cross_entropy",
                 valid_breaks=("strided_last_dim", "expanded_last_dim"))
             for name, o in zip(GRAD_NAMES[call.op], outs)]
    inputs = [a for a in call.args if isinstance(a, Arg)]
    # (a single gradient is returned unnamed)
    returned = [len(returns) == 1 and returns[0] == "" or f"grad_{a.name}" in returns for a in inputs]
    extra = [call.kwargs["out_dtype"]] if "out_dtype" in call.kwargs else []  # rms_norm's: positional here
    if saves_outputs:
        # The forward's defaults the call left out, then the outputs (read through a reshape: any layout).
        schema = getattr(torch.ops.ltx_kernels, call.op).default._schema
        extra = [a.default_value for a in schema.arguments[len(call.args):]]
        extra += [Arg(name, outs[i], copied=True) for name, i in SAVED_OUTPUTS[call.op].items()]

    def gradients():
        # The arguments' own tensors require grad while the formula runs (it reads some through
        # their Arg, some directly): each gradient is fp64 autograd's, rounded once to its dtype.
        saved = [a.tensor for a in inputs]
        present = [t for t in saved if t is not None and t.is_floating_point()]  # (a bool mask has none)
        for t in present:
            t.requires_grad_()
        try:
            ref = formula()
            ref = ref if isinstance(ref, tuple) else (ref,)
            cotangents = [g.tensor.double() for g in grads]

            def vjp(cotangents):
                return torch.autograd.grad(ref, present, cotangents, allow_unused=True, materialize_grads=True,
                                           retain_graph=True)

            got = vjp(cotangents)
            # A gradient summed over rows (a weight's, a gate's) is rounded term by term, its
            # errors adding in quadrature: its tolerance is relative to the root sum of squares
            # of the rows' parts, not to the sum where that cancels (a one-element weight
            # gradient of 1e-3 from terms of 1). Where the parts do not cancel (a row-wise x
            # gradient, whose parts do not overlap; a typical sum) the two agree.
            size = [torch.zeros_like(g) for g in got]
            for part in row_parts(cotangents, MAGNITUDE_PARTS):
                for total, g in zip(size, vjp(part)):
                    total += g.square()
        finally:
            for t in present:
                t.requires_grad_(False)
        got, size = iter(got), iter(size)
        scales = []
        result = []
        for t, kept in zip(saved, returned):
            grad = torch.empty(0) if t is None else next(got) if t.is_floating_point() else torch.empty(0, dtype=t.dtype)
            squares = next(size) if t is not None and t.is_floating_point() else None
            if kept:
                result.append(grad)
                scales.append(back.scale * cancellation(grad, squares))
        back.out_scales = scales
        return tuple(result) if len(result) > 1 else result[0]  # a single gradient is returned bare

    back = Call(f"{call.op}_backward", grads + call.args + extra, scale=10.0 if dtype == torch.float32 else 4.0,
                out_dtypes=[dtype if a.tensor is None else a.tensor.dtype for a, kept in zip(inputs, returned) if kept])
    return back, gradients


# The outputs a backward op takes after the forward's arguments (autograd saves them), by index.
SAVED_OUTPUTS = {"fused_linear_cross_entropy": {"loss": 0, "lse": 1}, "fused_add_rms_norm": {"new_residual": 1}}
# The names of the gradients a backward op takes, in its schema's order.
GRAD_NAMES = {
    "rms_norm": ["grad_out"], "layer_norm": ["grad_out"], "fused_add_rms_norm": ["grad_out", "grad_new_residual"],
    "adaln_rms_norm": ["grad_out"], "adaln_layer_norm": ["grad_out"],
    "gated_residual_adaln_rms_norm": ["grad_x_new", "grad_normed"],
    "gelu_tanh": ["grad_out"], "gelu_tanh_and_mul": ["grad_out"], "gelu_and_mul": ["grad_out"],
    "silu_and_mul": ["grad_out"], "geglu": ["grad_out"], "swiglu": ["grad_out"], "gated_residual": ["grad_out"],
    "linear_gelu_tanh": ["grad_out"], "linear_gated_residual": ["grad_out"], "glu_linear": ["grad_out"],
    "attention": ["grad_out"],
    "group_norm": ["grad_out"],
    "apply_rotary_pos_emb": ["grad_q_out", "grad_k_out"], "ltx_rope": ["grad_out"],
    "ltx_qk_norm_rope": ["grad_q_out", "grad_k_out"], "fused_linear_cross_entropy": ["grad_loss", "grad_lse"],
}
BACKWARD_BUILDERS = {f"{name}_backward": (lambda forward: lambda draw, dtype: build_backward(draw, dtype, forward))(
    BUILDERS[name]) for name in ["rms_norm", "layer_norm", "fused_add_rms_norm", "adaln_rms_norm", "adaln_layer_norm",
                                 "gated_residual_adaln_rms_norm", "gated_residual", "gelu_tanh", "and_mul", "glu",
                                 "linear_gelu_tanh", "linear_gated_residual", "glu_linear", "attention", "group_norm",
                                 "apply_rotary_pos_emb", "ltx_rope",
                                 "ltx_qk_norm_rope", "fused_linear_cross_entropy"]}
BUILDERS.update(BACKWARD_BUILDERS)


@st.composite
def valid_calls(draw, builder):
    torch.manual_seed(draw(st.integers(0, 2**31 - 1)))  # the tensors' values: part of the case
    dtype = draw(st.sampled_from(DTYPES))
    return (dtype, *BUILDERS[builder](draw, dtype))


def check_matches(out, ref, dtype, call, scale=None, out_dtype=None):
    if isinstance(ref, tuple):
        assert isinstance(out, tuple) and len(out) == len(ref)
        for i, (o, r) in enumerate(zip(out, ref)):
            check_matches(o, r, dtype, call, call.out_scales[i] if call.out_scales else scale,
                          call.out_dtypes[i] if call.out_dtypes else None)
        return
    if scale is None and call.out_scales:  # (a single gradient, returned bare)
        scale = call.out_scales[0]
    if call.exact:
        assert out.dtype == ref.dtype and torch.equal(out.view(torch.uint8), ref.view(torch.uint8))
    elif ref.numel() == 0:  # e.g. the gradient of an argument that has none (an absent one, a bool mask)
        assert out.shape == ref.shape and out.dtype == (out_dtype or call.out_dtype or dtype)
    else:
        out_dtype = out_dtype or call.out_dtype or dtype
        assert out.dtype == out_dtype
        assert_close(out, ref, out_dtype, scale=scale or call.scale)


def to_cpu(out):
    return tuple(o.cpu() for o in out) if isinstance(out, (tuple, list)) else out.cpu()


def shapes_of(out):
    """Shape, dtype and strides (torch.compile lays out the real tensors as Meta says; a tensor
    of one element or none has no layout to agree on)."""
    if isinstance(out, (tuple, list)):
        return [shapes_of(o) for o in out]
    return (tuple(out.shape), out.dtype, out.stride() if out.numel() > 1 else None)


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@SETTINGS
@hypothesis.seed(int(SEED or 0))  # used only with FUZZ_SEED (derandomize off)
@given(data=st.data())
def test_valid_calls_match_the_formula(builder, data):
    dtype, call, formula = data.draw(valid_calls(builder))
    out, ref = call.run(), formula()
    check_matches(out, ref, dtype, call)
    assert shapes_of(call.run("meta")) == shapes_of(out)
    # No output is (a view of) an input or of another output: the schemas declare no alias.
    inputs = {a.tensor.untyped_storage().data_ptr() for a in call.tensors() if a.tensor.numel()}
    outputs = [o.untyped_storage().data_ptr() for o in (out if isinstance(out, tuple) else (out,)) if o.numel()]
    assert not inputs & set(outputs) and len(set(outputs)) == len(outputs)
    if HAS_CUDA and call.cuda_refuses:
        with pytest.raises((TypeError, ValueError), match=f"{call.op}: on CUDA"):
            call.run("cuda")
    elif HAS_CUDA:
        cuda_out = call.run("cuda")
        assert shapes_of(cuda_out) == shapes_of(out)  # (the CUDA kernels' layouts: Meta's too)
        check_matches(to_cpu(cuda_out), call.cuda_formula() if call.cuda_formula else ref, dtype, call,
                      call.cuda_scale)


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@settings(max_examples=6, derandomize=SEED is None, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@hypothesis.seed(int(SEED or 0))
@given(data=st.data())
def test_valid_calls_pass_opcheck(builder, data):
    """torch.library.opcheck on drawn valid calls: the schema's alias and mutation claims hold
    (test_schema) and the Meta implementation runs under FakeTensorMode with the real outputs'
    metadata (test_faketensor). An op with float8 inputs skips test_schema: opcheck perturbs
    the inputs with a multiply that float8 tensors do not have."""
    _, call, _ = data.draw(valid_calls(builder))
    args = tuple(a.tensor if isinstance(a, Arg) else a for a in call.args)
    fp8 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
    torch.library.opcheck(getattr(ops, call.op).default, args, call.kwargs,
                          test_utils=("test_faketensor",) if fp8 else ("test_schema", "test_faketensor"))


# Ways to break one tensor argument: each is invalid for every tensor argument of every op
# (but the layouts, for an argument the op copies).
BREAKS = ["int_dtype", "float64", "wider_last_dim", "strided_last_dim", "expanded_last_dim", "zero_dim", "device"]


def broken(arg: Arg, how: str) -> torch.Tensor:
    t = arg.tensor
    if how == "int_dtype":
        return t.to(torch.int32)
    if how == "float64":
        return t.double()
    if how == "wider_last_dim":  # (of a 0-dim tensor: two elements)
        return torch.cat([t if t.dim() else t.reshape(1), torch.zeros(*t.shape[:-1], 1, dtype=t.dtype)], -1)
    if how == "strided_last_dim":
        wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        return wide[..., ::2]
    if how == "expanded_last_dim":
        return t[..., :1].expand(t.shape)
    if how == "zero_dim":
        return t.flatten()[0] if t.numel() else torch.tensor(0.0, dtype=t.dtype)
    if how == "device":
        return t.to("meta")
    raise ValueError(how)


@st.composite
def invalid_calls(draw, builder):
    _, call, _ = draw(valid_calls(builder))
    candidates = [i for i, a in enumerate(call.args) if isinstance(a, Arg) and a.tensor is not None]
    i = draw(st.sampled_from(candidates))
    arg = call.args[i]
    alone = len(candidates) == 1  # nothing to disagree with in size or device
    hows = [h for h in BREAKS
            # A last dim of 1 (or none, 0-dim) has no stride to break, nor a 0-dim tensor a 0-dim
            # form; a copied argument may have any layout.
            if not (h in ("strided_last_dim", "expanded_last_dim") and (arg.copied or arg.tensor.shape[-1:] <= (1,)))
            and not (h == "zero_dim" and arg.tensor.dim() == 0)
            and not (h in ("wider_last_dim", "device") and alone) and h not in arg.valid_breaks]
    how = draw(st.sampled_from(hows))
    call.args[i] = Arg(arg.name, broken(arg, how), arg.copied)
    return call, arg.name, how


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@SETTINGS
@hypothesis.seed(int(SEED or 0))  # used only with FUZZ_SEED (derandomize off)
@given(data=st.data())
def test_invalid_calls_raise_clear_errors(builder, data):
    call, name, how = data.draw(invalid_calls(builder))
    with pytest.raises((TypeError, ValueError)) as cpu:
        call.run()
    message = str(cpu.value)
    # The argument is named (the whole message: the op is named by torch's dispatcher frame
    # for schema errors, and by our checks otherwise).
    assert name in message or (how == "int_dtype" and "dtype" in message), (how, name, message)
    if how != "device":
        for device in ["meta"] + (["cuda"] if HAS_CUDA else []):
            with pytest.raises(type(cpu.value)):
                call.run(device)

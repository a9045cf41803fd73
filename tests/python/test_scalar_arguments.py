"""Scalar arguments of every public Python function (the ops, the layers, the diffusers and
transformers integrations, the Hub export): a fuzz of wrong values (wrong types, NaN, inf,
negative or zero values, out-of-range ints, unknown strings) must give only a TypeError or
ValueError whose message starts with ``<function>: <argument>``, before the dispatcher (whose
own errors are RuntimeErrors naming neither). hypothesis is derandomized: the same cases on
every run."""

import functools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import ltx_kernels
import ltx_kernels.diffusers as lkd
import ltx_kernels.transformers as lt
from ltx_kernels import hub, layers

SETTINGS = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))

X = torch.randn(2, 3, 12)
W = torch.randn(12)
Q = torch.randn(1, 2 * 3 * 4, 2, 12)  # [B, F*H*W, heads, Dh] for rope_3d / rope_1d
LTX = torch.randn(1, 24, 12)  # [B, S, D] for the LTX RoPE forms, grid 2 x 3 x 4
COS = torch.randn(3, 12)
R = torch.randn(1, 2, 3, 12)  # [B, H, S, Dh] for apply_rotary_pos_emb
W8, W8_SCALE = ltx_kernels.quantize_fp8(torch.randn(16, 16))
NO_SOURCE = "/nonexistent/ltx-kernels-source"  # export reads it after its checks: a slip fails there


def norm_module(cls_name: str, attribute: str, value) -> nn.Module:
    """A stand-in for an HF norm of class ``cls_name`` whose epsilon ``attribute`` is ``value``."""
    module = type(cls_name, (nn.Module,), {})()
    module.weight = nn.Parameter(torch.randn(12), requires_grad=False)
    setattr(module, attribute, value)
    return module


@functools.cache
def diffusers_model() -> nn.Module:
    from diffusers.models.normalization import RMSNorm

    return RMSNorm(12, eps=1e-6)


@functools.cache
def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(config).eval()


def inject_and_remove(**kwargs):
    lkd.inject(diffusers_model(), **kwargs)
    lkd.remove(diffusers_model())


def apply_and_remove(**kwargs):
    lt.apply(llama(), **kwargs)
    lt.remove(llama())


def ltx_qk(**kwargs):
    return ltx_kernels.ltx_qk_norm_rope(LTX, LTX, None, None, **{"num_frames": 2, "height": 3, "width": 4, **kwargs})


GRID = {"num_frames": 2, "height": 3, "width": 4}
LTX_POSITION_ARGS = [(name, "count", GRID[name]) for name in GRID] + [
    ("rope_interpolation_scale", "scale3", (0.32, 32, 32)),
    ("theta", "positive", 1e4),
    *[(name, "positive", 1000) for name in ("base_num_frames", "base_height", "base_width")],
    *[(name, "positive", 2) for name in ("patch_size", "patch_size_t")],
]


def _scale_kwargs(name, value):
    # patch and base sizes are read only with a rope_interpolation_scale
    return {name: value} if name == "rope_interpolation_scale" else {name: value, "rope_interpolation_scale": (1, 1, 1)}


# (function as named in messages, argument, kind of value, call(value), a good value)
CASES = [
    ("rms_norm", "eps", "nonneg", lambda v: ltx_kernels.rms_norm(X, W, v), 1e-6),
    ("rms_norm", "weight_offset", "real", lambda v: ltx_kernels.rms_norm(X, W, weight_offset=v), 1.0),
    ("fused_add_rms_norm", "eps", "nonneg", lambda v: ltx_kernels.fused_add_rms_norm(X, X, W, v), 0),
    ("fused_add_rms_norm", "weight_offset", "real",
     lambda v: ltx_kernels.fused_add_rms_norm(X, X, W, weight_offset=v), -1),
    ("fused_add_rms_norm_", "eps", "nonneg", lambda v: ltx_kernels.fused_add_rms_norm_(X, X.clone(), W, v), 1e-6),
    ("fused_add_rms_norm_", "weight_offset", "real",
     lambda v: ltx_kernels.fused_add_rms_norm_(X, X.clone(), W, weight_offset=v), 0.5),
    ("layer_norm", "eps", "nonneg", lambda v: ltx_kernels.layer_norm(X, W, None, v), 1e-5),
    ("adaln_rms_norm", "eps", "nonneg", lambda v: ltx_kernels.adaln_rms_norm(X, W, W, None, v), 1e-6),
    ("adaln_layer_norm", "eps", "nonneg", lambda v: ltx_kernels.adaln_layer_norm(X, W, W, None, None, v), 1e-6),
    ("gated_residual_adaln_rms_norm", "eps", "nonneg",
     lambda v: ltx_kernels.gated_residual_adaln_rms_norm(X, X, None, W, W, None, v), 1e-6),
    ("quantize_fp8", "activation", ("none", "gelu_tanh"),
     lambda v: ltx_kernels.quantize_fp8(torch.randn(2, 16), activation=v), "gelu_tanh"),
    ("fp8_linear", "out_dtype", "dtype",
     lambda v: ltx_kernels.fp8_linear(torch.randn(2, 16), W8, W8_SCALE, out_dtype=v), torch.float32),
    ("fp8_linear", "activation", ("none", "gelu_tanh"),
     lambda v: ltx_kernels.fp8_linear(torch.randn(2, 16), W8, W8_SCALE, activation=v), "gelu_tanh"),
    ("attention", "scale", "optional_real", lambda v: ltx_kernels.attention(X[None], X[None], X[None], scale=v), 0.5),
    ("attention", "precision", ("bf16", "8bit"),
     lambda v: ltx_kernels.attention(X[None], X[None], X[None], precision=v), "8bit"),
    ("geglu", "approximate", "approximate", lambda v: ltx_kernels.geglu(torch.randn(2, 8), approximate=v), False),
    ("apply_rotary_pos_emb", "interleaved", "flag",
     lambda v: ltx_kernels.apply_rotary_pos_emb(R, R, COS, COS, interleaved=v), True),
    ("apply_rotary_pos_emb", "unsqueeze_dim", "unsqueeze_dim",
     lambda v: ltx_kernels.apply_rotary_pos_emb(R, R, COS, COS, unsqueeze_dim=v), 1),
    ("apply_rotary_pos_emb", "sections", "sections",
     lambda v: ltx_kernels.apply_rotary_pos_emb(R, R, COS, COS, sections=v), [4, 4, 4]),
    ("rope_1d", "theta_base", "positive", lambda v: ltx_kernels.rope_1d(Q, Q, v), 500.0),
    ("rope_3d_sections", "head_dim", "size", ltx_kernels.rope_3d_sections, 0),
    *[("rope_3d", name, "count", lambda v, name=name: ltx_kernels.rope_3d(Q, Q, **{**GRID, name: v}), GRID[name])
      for name in GRID],
    ("rope_3d", "theta_base", "positive", lambda v: ltx_kernels.rope_3d(Q, Q, 2, 3, 4, v), 1e4),
    *[("ltx_rope_angles", name, kind,
       lambda v, name=name: ltx_kernels.ltx_rope_angles(LTX, **{**GRID, **_scale_kwargs(name, v)}), good)
      for name, kind, good in LTX_POSITION_ARGS],
    ("ltx_qk_norm_rope", "eps", "nonneg", lambda v: ltx_qk(eps=v), 1e-5),
    *[("ltx_qk_norm_rope", name, kind, lambda v, name=name: ltx_qk(**_scale_kwargs(name, v)), good)
      for name, kind, good in LTX_POSITION_ARGS],
    # the original package's names
    ("rmsnorm", "eps", "nonneg", lambda v: ltx_kernels.rmsnorm(X, W, v), 1e-6),
    ("rmsnorm_residual", "eps", "nonneg", lambda v: ltx_kernels.rmsnorm_residual(X, X, W, v), 1e-6),
    ("adaln_rmsnorm", "eps", "nonneg", lambda v: ltx_kernels.adaln_rmsnorm(X, W, W, W, v), 1e-6),
    ("adaln_layernorm", "eps", "nonneg", lambda v: ltx_kernels.adaln_layernorm(X, W, W, W, W, v), 1e-5),
    ("adaln_zero", "eps", "nonneg", lambda v: ltx_kernels.adaln_zero(X, W, W, W, W, v), 1e-6),
    # layers: the scalar is the replaced module's attribute (None means absent: test_layers.py)
    ("LlamaRMSNorm", "variance_epsilon", "nonneg_attribute",
     lambda v: layers.RMSNorm.forward(norm_module("LlamaRMSNorm", "variance_epsilon", v), X), 1e-6),
    ("GemmaRMSNorm", "eps", "nonneg_attribute",
     lambda v: layers.GemmaRMSNorm.forward(norm_module("GemmaRMSNorm", "eps", v), X), 1e-6),
    ("RMSNorm", "eps", "nonneg_attribute",
     lambda v: layers.DiffusersRMSNorm.forward(norm_module("RMSNorm", "eps", v), X), 1e-6),
    # integrations
    ("inject", "pipe_or_model", "model", lkd.inject, None),
    ("inject", "rope", ("exact", "stock"), lambda v: inject_and_remove(rope=v), "stock"),
    ("inject", "precision", ("bf16", "fp8"), lambda v: inject_and_remove(precision=v), "bf16"),
    ("inject", "fp8_skip", "strings", lambda v: inject_and_remove(fp8_skip=v), ["proj_in"]),
    ("inject", "attention", "optional_attention", lambda v: inject_and_remove(attention=v), "bf16"),
    ("remove", "pipe_or_model", "model", lkd.remove, None),
    ("apply", "model", "model", lt.apply, None),
    ("apply", "precision", ("bf16", "fp8"), lambda v: apply_and_remove(precision=v), "bf16"),
    ("apply", "fp8_skip", "strings", lambda v: apply_and_remove(fp8_skip=v), ["lm_head", "*.mlp.*"]),
    ("remove", "model", "model", lt.remove, None),
    ("check_version", "version", "version", lt.check_version, "5.17.0"),
    ("variant_name", "backend", ("cuda", "cpu"), hub.variant_name, "cpu"),
    ("export", "outdir", "path", lambda v: hub.export(v, NO_SOURCE), None),
    ("export", "source", "path", lambda v: hub.export("out", v), None),
    ("export", "backend", "optional_backend", lambda v: hub.export("out", NO_SOURCE, backend=v), None),
    ("export", "archs", "optional_strings", lambda v: hub.export("out", NO_SOURCE, archs=v), None),
]
IDS = [f"{fn}-{arg}" for fn, arg, *_ in CASES]

# Values of no scalar type (or of a wrong one: a tensor is data, a bool is not a number).
NOT_SCALARS = st.sampled_from([None, b"1", [1.0], (1, 2), {"eps": 1}, object(), torch.tensor(1e-6),
                               torch.tensor([1.0, 2.0]), torch.tensor(2), torch.float32, math])
NON_NUMBERS = NOT_SCALARS | st.text(max_size=8) | st.booleans() | st.complex_numbers(allow_nan=False, min_magnitude=1)
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf]) | st.integers(min_value=2**1024) | st.integers(max_value=-(2**1024))
NEGATIVE = st.floats(max_value=0, exclude_max=True) | st.integers(max_value=-1)
NON_INTS = NON_NUMBERS | st.floats()
TOO_LARGE = st.integers(min_value=2**63) | st.integers(max_value=-(2**63) - 1)


def choices(allowed: tuple[str, ...]):
    """Anything but one of ``allowed``."""
    return NOT_SCALARS | st.booleans() | st.integers() | st.text(max_size=8).filter(lambda s: s not in allowed)


def optional(values):
    """``values`` for an argument where None is allowed (a default)."""
    return values.filter(lambda v: v is not None)


STRINGS = (NOT_SCALARS | st.text(max_size=8) | st.integers()
           | st.lists(st.text(max_size=4) | NOT_SCALARS, min_size=1, max_size=3).filter(
               lambda s: not all(isinstance(p, str) for p in s)))

BAD = {
    "real": NON_NUMBERS | NON_FINITE,
    "optional_real": optional(NON_NUMBERS | NON_FINITE),
    "nonneg": NON_NUMBERS | NON_FINITE | NEGATIVE,
    "nonneg_attribute": optional(NON_NUMBERS | NON_FINITE | NEGATIVE),  # None: no such attribute
    "positive": NON_NUMBERS | NON_FINITE | NEGATIVE | st.just(0) | st.just(0.0),
    "count": NON_INTS | st.integers(max_value=0) | TOO_LARGE,
    "size": NON_INTS | st.integers(max_value=-1) | TOO_LARGE,
    "unsqueeze_dim": NON_INTS | st.integers().filter(lambda n: n not in (1, 2)),
    "flag": NOT_SCALARS | st.integers() | st.floats() | st.text(max_size=8),
    "dtype": NOT_SCALARS.filter(lambda v: not isinstance(v, torch.dtype) and v is not None) | st.text(max_size=8)
    | st.integers(),
    "scale3": (NOT_SCALARS.filter(lambda v: v is not None) | st.text(max_size=8) | st.sets(st.floats(), min_size=3, max_size=3)
               | st.lists(st.floats(-10, 10), max_size=6).filter(lambda s: len(s) != 3)
               | st.tuples(st.floats(-10, 10), NON_NUMBERS | NON_FINITE, st.floats(-10, 10))),
    "sections": (NOT_SCALARS.filter(lambda v: v is not None and not isinstance(v, (list, tuple))) | st.integers()
                 | st.text(max_size=8)
                 | st.lists(st.integers(0, 6).map(lambda n: 2 * n), min_size=4, max_size=6)  # too many
                 | st.just([])
                 | st.lists(st.integers(-8, 8).filter(lambda n: n < 0 or n % 2), min_size=1, max_size=3)
                 | st.lists(NON_INTS | TOO_LARGE, min_size=1, max_size=3)),
    "strings": STRINGS,
    "optional_strings": optional(STRINGS),
    "approximate": choices(("tanh", "none")).filter(lambda v: not isinstance(v, bool)),  # True / False also mean those
    "optional_attention": optional(choices(("bf16", "8bit"))),
    "optional_backend": optional(choices(hub.BACKENDS)),
    "model": NOT_SCALARS | st.text(max_size=8) | st.integers() | st.just(nn.Linear(2, 2)),
    "version": optional(NOT_SCALARS | st.integers() | st.text(max_size=8).filter(lambda s: not s.split(".")[0].isdigit())),
    "path": NOT_SCALARS | st.integers() | st.floats(),
}


def bad_values(kind):
    return choices(kind) if isinstance(kind, tuple) else BAD[kind]


# The usual mistakes, each tried for every case (the fuzz above may not draw them all).
REALS = ["1e-6", None, True, 1j, torch.tensor(1e-6), math.nan, math.inf, 10**400]
INTS = ["2", 2.0, None, True, torch.tensor(2), 2**63]
STRING_LISTS = ["proj_in", None, 1, ["a", None], ("a", 1)]
UNKNOWN = [None, 1, True, "", "unknown", torch.tensor(1)]
TYPICAL = {
    "real": REALS,
    "optional_real": [v for v in REALS if v is not None],
    "nonneg": REALS + [-1e-6, -math.inf],
    "nonneg_attribute": [v for v in REALS if v is not None] + [-1e-6, -math.inf],
    "positive": REALS + [0, 0.0, -5.0],
    "count": INTS + [0, -1],
    "size": INTS + [-1],
    "unsqueeze_dim": INTS + [0, 3, -1],
    "flag": ["yes", 1, 0, None, torch.tensor(True)],
    "dtype": ["float32", 1, torch.tensor(1.0)],
    "scale3": ["1", [1.0, 2.0], (1.0, 2.0, 3.0, 4.0), {1.0, 2.0, 3.0}, {1: 2, 3: 4, 5: 6},
               torch.tensor([1.0, 2.0, 3.0]), (1.0, math.nan, 1.0), (1.0, "2", 1.0)],
    "sections": [4, "4", torch.tensor([4, 4, 4]), [], [4, 4, 2, 2], [3, 5, 4], [-2, 8, 6], [4.0, 4, 4]],
    "strings": STRING_LISTS,
    "optional_strings": [v for v in STRING_LISTS if v is not None],
    "approximate": [None, 1, "exact", torch.tensor(1)],
    "optional_attention": [v for v in UNKNOWN if v is not None],
    "optional_backend": [v for v in UNKNOWN if v is not None],
    "model": [None, "LTX-Video", 1, nn.Linear(2, 2), torch.randn(2)],
    "version": ["abc", 5, ".5"],
    "path": [None, 1, 1.5, torch.tensor(1)],
}


def check_refused(fn, arg, call, value):
    with pytest.raises((TypeError, ValueError), match=rf"^{fn}: {arg}\b") as info:
        call(value)
    # pytest.raises accepts subclasses: torch's errors derive from these too, but not exactly.
    assert type(info.value) in (TypeError, ValueError), (value, info.value)


@pytest.mark.parametrize("fn, arg, kind, call, good", CASES, ids=IDS)
def test_typical_mistakes_name_the_function_and_the_argument(fn, arg, kind, call, good):
    for value in TYPICAL.get(kind, UNKNOWN):  # a tuple kind: the allowed strings
        check_refused(fn, arg, call, value)


@pytest.mark.parametrize("fn, arg, kind, call, good", CASES, ids=IDS)
@SETTINGS
@given(data=st.data())
def test_bad_scalars_name_the_function_and_the_argument(fn, arg, kind, call, good, data):
    check_refused(fn, arg, call, data.draw(bad_values(kind), label=arg))


@pytest.mark.parametrize("fn, arg, kind, call, good", [c for c in CASES if c[4] is not None],
                         ids=[i for i, c in zip(IDS, CASES) if c[4] is not None])
def test_good_scalars_pass(fn, arg, kind, call, good):
    call(good)


def test_inject_refuses_what_is_not_diffusers():
    """A module holding no diffusers module (``apply`` refuses the same way what is not a
    transformers model)."""
    with pytest.raises(TypeError, match="inject: pipe_or_model must be a diffusers pipeline or model, got Linear"):
        lkd.inject(nn.Linear(3, 3))
    with pytest.raises(TypeError, match="apply: model must be a transformers PreTrainedModel with a config, got Linear"):
        lt.apply(nn.Linear(3, 3))


def test_grid_mismatch_names_the_parameter():
    with pytest.raises(ValueError, match=r"^ltx_qk_norm_rope: q must have num_frames \* height \* width = 30 tokens"):
        ltx_qk(width=5)
    with pytest.raises(ValueError, match=r"^ltx_rope_angles: x must have num_frames \* height \* width = 30 tokens"):
        ltx_kernels.ltx_rope_angles(LTX, 2, 3, 5)
    with pytest.raises(ValueError, match=r"^rope_3d: query must have num_frames \* height \* width = 30 tokens"):
        ltx_kernels.rope_3d(Q, Q, 2, 3, 5)

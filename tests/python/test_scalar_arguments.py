"""Scalar arguments of the public functions: wrong types, NaN, inf, negative or zero values and
unknown strings give a TypeError or ValueError that names the function and the argument."""

import math

import pytest
import torch

import ltx_kernels

X = torch.randn(2, 3, 12)
W = torch.randn(12)
Q = torch.randn(1, 2 * 3 * 4, 2, 12)  # [B, F*H*W, heads, Dh] for rope_3d / rope_1d
LTX = torch.randn(1, 24, 12)  # [B, S, D] for the LTX RoPE forms, grid 2 x 3 x 4
COS = torch.randn(3, 12)
R = torch.randn(1, 2, 3, 12)  # [B, H, S, Dh] for apply_rotary_pos_emb

# (function name, call with the argument under test, argument name, kind)
CASES = [
    ("rms_norm", lambda v: ltx_kernels.rms_norm(X, W, v), "eps", "nonneg"),
    ("rms_norm", lambda v: ltx_kernels.rms_norm(X, W, 1e-6, weight_offset=v), "weight_offset", "real"),
    ("fused_add_rms_norm", lambda v: ltx_kernels.fused_add_rms_norm(X, X, W, v), "eps", "nonneg"),
    ("fused_add_rms_norm_", lambda v: ltx_kernels.fused_add_rms_norm_(X, X.clone(), W, v), "eps", "nonneg"),
    ("layer_norm", lambda v: ltx_kernels.layer_norm(X, W, None, v), "eps", "nonneg"),
    ("adaln_rms_norm", lambda v: ltx_kernels.adaln_rms_norm(X, W, W, None, v), "eps", "nonneg"),
    ("adaln_layer_norm", lambda v: ltx_kernels.adaln_layer_norm(X, W, W, None, None, v), "eps", "nonneg"),
    ("gated_residual_adaln_rms_norm",
     lambda v: ltx_kernels.gated_residual_adaln_rms_norm(X, X, None, W, W, None, v), "eps", "nonneg"),
    ("apply_rotary_pos_emb", lambda v: ltx_kernels.apply_rotary_pos_emb(R, R, COS, COS, interleaved=v),
     "interleaved", "flag"),
    ("apply_rotary_pos_emb", lambda v: ltx_kernels.apply_rotary_pos_emb(R, R, COS, COS, unsqueeze_dim=v),
     "unsqueeze_dim", "int"),
    ("rope_1d", lambda v: ltx_kernels.rope_1d(Q, Q, v), "theta_base", "positive"),
    ("rope_3d", lambda v: ltx_kernels.rope_3d(Q, Q, v, 3, 4), "num_frames", "count"),
    ("rope_3d", lambda v: ltx_kernels.rope_3d(Q, Q, 2, 3, 4, v), "theta_base", "positive"),
    ("ltx_rope_angles", lambda v: ltx_kernels.ltx_rope_angles(LTX, 2, v, 4), "height", "count"),
    ("ltx_rope_angles", lambda v: ltx_kernels.ltx_rope_angles(LTX, 2, 3, 4, theta=v), "theta", "positive"),
    ("ltx_qk_norm_rope", lambda v: ltx_kernels.ltx_qk_norm_rope(LTX, LTX, None, None, v, num_frames=2, height=3,
                                                                width=4), "eps", "nonneg"),
    ("ltx_qk_norm_rope", lambda v: ltx_kernels.ltx_qk_norm_rope(LTX, LTX, None, None, 1e-5, num_frames=2, height=3,
                                                                width=v), "width", "count"),
    ("attention", lambda v: ltx_kernels.attention(X[None], X[None], X[None], scale=v), "scale", "optional_real"),
]

BAD = {
    "real": ["1e-6", None, [1.0], True, math.nan, math.inf],
    "optional_real": ["1e-6", [1.0], True, math.nan, math.inf],  # None is the default
    "nonneg": ["1e-6", None, True, math.nan, -math.inf, -1e-6],
    "positive": ["1e4", None, True, math.nan, 0.0, -5.0],
    "int": ["1", 1.5, None, True],
    "count": ["2", 2.0, None, True, 0, -1],
    "flag": ["yes", 1, None],
}


@pytest.mark.parametrize("fn, call, arg, kind", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_bad_scalars_name_the_function_and_the_argument(fn, call, arg, kind):
    for value in BAD[kind]:
        with pytest.raises((TypeError, ValueError), match=rf"^{fn}: {arg} ") as info:
            call(value)
        assert type(info.value) in (TypeError, ValueError), (value, info.value)


@pytest.mark.parametrize("fn, call, arg, kind", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_good_scalars_pass(fn, call, arg, kind):
    grid = {"num_frames": 2, "height": 3, "width": 4}
    good = {"real": 0.5, "optional_real": 0.5, "nonneg": 1e-5, "positive": 1e4, "int": 1, "count": grid.get(arg), "flag": False}
    call(good[kind])


def test_unknown_strings():
    with pytest.raises(ValueError, match="geglu: approximate must be"):
        ltx_kernels.geglu(torch.randn(2, 8), approximate="fast")
    with pytest.raises(ValueError, match="quantize_fp8: activation must be"):
        ltx_kernels.quantize_fp8(torch.randn(2, 16), activation="gelu")
    with pytest.raises(ValueError, match="attention: precision must be"):
        ltx_kernels.attention(X[None], X[None], X[None], precision="fp4")
    with pytest.raises(TypeError, match="ltx_rope_angles: rope_interpolation_scale must be 3 numbers"):
        ltx_kernels.ltx_rope_angles(LTX, 2, 3, 4, rope_interpolation_scale=(1.0, 2.0))

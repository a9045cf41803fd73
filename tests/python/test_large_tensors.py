"""Tensors of more than 2^31 elements on the GPU: rms_norm, silu_and_mul, the LTX RoPE (angles
in the kernel) and group_norm (both layouts) index them with 64-bit offsets. Each test checks every row that lies
past element 2^31, and the rows around it, against the fp64 formula (the whole output would
not fit as fp64). CUDA only, with ~15 GB free; skipped otherwise."""

import pytest
import torch

import ltx_kernels
from conftest import HAS_CUDA, assert_close
from test_group_norm import formula as group_norm_formula
from test_rms_norm import rms_norm_formula
from test_rope import ltx_rope_formula, ltx_tables_fp64

LIMIT = 2**31
DTYPE = torch.bfloat16


def enough_memory(gib: float) -> bool:
    return HAS_CUDA and torch.cuda.mem_get_info()[0] >= gib * 2**30


pytestmark = pytest.mark.skipif(not enough_memory(15), reason="needs a CUDA device with 15 GiB free")


def rows_to_check(rows: int, cols: int) -> slice:
    """The rows from a few before the one holding element 2^31 to the last."""
    first_past = LIMIT // cols
    assert first_past < rows, "the tensor must pass 2^31 elements"
    return slice(first_past - 4, rows)


@pytest.fixture(autouse=True)
def free_memory():
    yield
    torch.cuda.empty_cache()


def test_rms_norm():
    cols = 4096
    rows = LIMIT // cols + 300  # 2^31 + 300 * 4096 elements
    x = torch.randn(rows, cols, dtype=DTYPE, device="cuda")
    weight = torch.randn(cols, dtype=DTYPE, device="cuda")
    out = ltx_kernels.rms_norm(x, weight, 1e-6)
    check = rows_to_check(rows, cols)
    assert_close(out[check], rms_norm_formula(x[check], weight), DTYPE)
    assert_close(out[:4], rms_norm_formula(x[:4], weight), DTYPE)


def test_silu_and_mul():
    cols = 4096
    rows = LIMIT // cols + 300
    gate = torch.randn(rows, cols, dtype=DTYPE, device="cuda")
    up = torch.randn(rows, cols, dtype=DTYPE, device="cuda")
    out = ltx_kernels.silu_and_mul(gate, up)
    check = rows_to_check(rows, cols)
    g, u = gate[check].double(), up[check].double()
    assert_close(out[check], torch.nn.functional.silu(g) * u, DTYPE)


def test_ltx_rope_angles():
    d = 2048  # LTX-Video 2B
    frames, height, width = 64, 128, 129  # S * D = 2^31 + 2^24 elements
    s = frames * height * width
    x = torch.randn(1, s, d, dtype=DTYPE, device="cuda")
    scale = (8 / 25, 32.0, 32.0)
    out = ltx_kernels.ltx_rope_angles(x, frames, height, width, rope_interpolation_scale=scale)
    tokens = torch.arange(s)[rows_to_check(s, d)]
    # Grid positions of those tokens, given as coordinates to the fp64 tables.
    pos = torch.stack([tokens // (height * width), tokens // width % height, tokens % width]).double()[None]
    cos, sin = ltx_tables_fp64(1, len(tokens), d, None, (scale[0] / 20, scale[1] / 2048, scale[2] / 2048), pos)
    assert_close(out[:, tokens], ltx_rope_formula(x[:, tokens], cos, sin), DTYPE)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_group_norm(layout):
    """A UNet's GroupNorm + SiLU over 2 x 64 x 4100 x 4100 (2^31 + 2^22 elements): the last two
    groups of the second sample, which hold element 2^31 in either layout, against fp64."""
    n, c, side, groups = 2, 64, 4100, 32
    x = torch.randn(n, c, side, side, dtype=DTYPE, device="cuda")
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    assert x.numel() > LIMIT
    weight = torch.randn(c, dtype=DTYPE, device="cuda")
    bias = torch.randn(c, dtype=DTYPE, device="cuda")
    out = ltx_kernels.group_norm(x, groups, weight, bias, 1e-5, activation="silu")
    last = slice(c - 2 * c // groups, c)  # the last two groups' channels
    expected = group_norm_formula(x[1:, last], 2, weight[last], bias[last], 1e-5, silu=True)
    assert_close(out[1:, last], expected, DTYPE)

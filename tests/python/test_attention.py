"""attention: the exact path against SDPA in fp64, the 8-bit method against an independent
plain-torch statement of its definition (include/ltx_kernels/attention.h), its error on randn
and outlier inputs, masks, GQA, strided inputs, Meta shapes and bad input; then the CUDA
kernel (bf16/fp16, head_dim 64 and 128) against the same statements on the GPU and against
the C++ CPU reference, with odd lengths, cross-attention padding, strided and misaligned
views and NaN propagation."""

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import ltx_kernels
from conftest import DTYPES, HAS_CUDA, assert_close, rel_err

ops = torch.ops.ltx_kernels
BLOCK = 64
# The 8-bit method's error against exact attention (issue targets, the repository's bar).
ERROR_RANDN, ERROR_OUTLIER = 4e-2, 1.5e-2

# (B, Hq, Hkv, Sq, Sk, D)
SHAPES = [(1, 1, 1, 1, 1, 64), (2, 4, 4, 7, 7, 64), (1, 2, 1, 129, 65, 128), (2, 2, 2, 33, 31, 8),
          (1, 4, 2, 70, 200, 64)]


def sdpa64(q, k, v, mask=None, scale=None):
    """SDPA in fp64 with GQA, rows whose keys are all masked set to 0 (SDPA gives NaN)."""
    if mask is not None and mask.is_floating_point():
        mask = mask.double()  # SDPA misreads an fp32 mask beside fp64 q/k/v (torch 2.11)
    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.nan_to_num(0.0)


def int8_blocks(x: torch.Tensor):
    """[B, H, S, D] fp32 -> (integer values as fp64, per-row scale [B, H, S]) in blocks of 64 rows."""
    b, h, s, d = x.shape
    pad = (-s) % BLOCK
    blocks = F.pad(x, (0, 0, 0, pad)).view(b, h, -1, BLOCK, d)
    amax = blocks.abs().amax(dim=(-2, -1), keepdim=True).clamp(min=1e-12)
    inv = amax.new_tensor(127.0) / amax
    values = torch.round(blocks * inv).clamp(-127, 127)  # torch.round is half to even
    scale = (amax / amax.new_tensor(127.0)).expand(b, h, -1, BLOCK, 1)
    return values.view(b, h, -1, d)[:, :, :s].double(), scale.reshape(b, h, -1)[:, :, :s]


def int8_attention(q, k, v, mask=None, scale=None):
    """The 8-bit method in plain torch: k smoothed by its fp32-rounded mean over the keys, q and
    k quantized per 64-token block, integer scores scaled in fp32, softmax and P v in fp64."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kf = k.float()
    kf = kf - kf.double().mean(dim=2, keepdim=True).float()
    q8, qs = int8_blocks(q.float())
    k8, ks = int8_blocks(kf)
    group = q.shape[1] // k.shape[1]
    k8, ks, v = k8.repeat_interleave(group, 1), ks.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q8 @ k8.transpose(-1, -2)).float() * qs[..., None] * ks[..., None, :] * scale
    scores = scores.double()
    if mask is not None:
        scores = scores + (torch.where(mask, 0.0, -math.inf) if mask.dtype == torch.bool else mask.double())
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v.double()


def qkv(shape, dtype, seed=0, layout="contiguous"):
    b, hq, hkv, sq, sk, d = shape
    g = torch.Generator().manual_seed(seed)
    if layout == "fused":  # views of one [B, S, 3, H, D] projection, as a fused QKV linear gives
        assert hq == hkv and sq == sk
        x = torch.randn(b, sq, 3, hq, d, generator=g).to(dtype)
        return tuple(x[:, :, i].transpose(1, 2) for i in range(3))
    return (torch.randn(b, hq, sq, d, generator=g).to(dtype), torch.randn(b, hkv, sk, d, generator=g).to(dtype),
            torch.randn(b, hkv, sk, d, generator=g).to(dtype))


def outlier_qkv(b, h, s, d, seed=0):
    """The issue's outlier inputs: K with per-channel offsets of ~4 sigma, a few hot channels."""
    g = torch.Generator().manual_seed(seed)
    hot = torch.ones(d)
    hot[: max(d // 32, 1)] = 8.0
    c_k, c_v = torch.randn(1, h, 1, d, generator=g), torch.randn(1, h, 1, d, generator=g)
    q = hot * torch.randn(b, h, s, d, generator=g)
    k = 0.5 * hot * (torch.randn(b, h, s, d, generator=g) + 4 * c_k)
    v = torch.randn(b, h, s, d, generator=g) + 2 * c_v
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_exact_matches_sdpa(dtype, shape):
    q, k, v = qkv(shape, dtype)
    out = ltx_kernels.attention(q, k, v)
    assert out.dtype == dtype and out.shape == q.shape
    # Laid out [B, S, H, D], so the heads fold back into channels without a copy.
    assert out.transpose(1, 2).is_contiguous()
    assert_close(out, sdpa64(q, k, v), dtype)


@pytest.mark.parametrize("precision", ["bf16", "8bit"])
def test_strided_views_of_a_fused_projection(precision):
    q, k, v = qkv((2, 3, 3, 40, 40, 64), torch.bfloat16, layout="fused")
    assert not q.is_contiguous()
    out = ltx_kernels.attention(q, k, v, precision=precision)
    same = ltx_kernels.attention(q.contiguous(), k.contiguous(), v.contiguous(), precision=precision)
    assert torch.equal(out, same)


@pytest.mark.parametrize("precision", ["bf16", "8bit"])
def test_masks_and_fully_masked_rows(precision):
    q, k, v = qkv((2, 2, 2, 9, 13, 64), torch.float32)
    padding = torch.ones(2, 1, 1, 13, dtype=torch.bool)
    padding[1, ..., 5:] = False  # cross-attention key padding
    additive = torch.randn(9, 13)
    rows = torch.ones(2, 2, 9, 13, dtype=torch.bool)
    rows[0, 1, 3] = False  # one query row with every key masked
    reference = sdpa64 if precision == "bf16" else int8_attention
    for mask in (padding, additive, rows):
        out = ltx_kernels.attention(q, k, v, attn_mask=mask, precision=precision)
        assert_close(out, reference(q, k, v, mask), torch.float32)
    out = ltx_kernels.attention(q, k, v, attn_mask=rows, precision=precision)
    assert (out[0, 1, 3] == 0).all() and torch.isfinite(out).all()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_8bit_matches_its_definition(shape, scale):
    q, k, v = qkv(shape, torch.float32, seed=1)
    out = ltx_kernels.attention(q, k, v, scale=scale, precision="8bit")
    assert_close(out, int8_attention(q, k, v, scale=scale), torch.float32)


@pytest.mark.parametrize("d", [64, 128])
def test_8bit_error_within_the_targets(d):
    """Against exact attention: randn, and the outlier inputs where naive 8-bit fails (the K
    channel offsets are what the smoothing removes)."""
    q, k, v = qkv((1, 2, 2, 300, 300, d), torch.float32, seed=2)
    err = rel_err(ltx_kernels.attention(q, k, v, precision="8bit"), sdpa64(q, k, v))
    assert 1e-4 < err <= ERROR_RANDN, err
    q, k, v = outlier_qkv(1, 2, 300, d)
    err = rel_err(ltx_kernels.attention(q, k, v, precision="8bit"), sdpa64(q, k, v))
    assert 1e-4 < err <= ERROR_OUTLIER, err


@pytest.mark.parametrize("precision", ["bf16", "8bit"])
def test_nan_propagates(precision):
    """A NaN in q makes its row NaN (bf16) or its 64-row quantization block's rows (8-bit,
    through the block scale); rows elsewhere stay finite. A NaN is not a masked key."""
    q, k, v = qkv((1, 1, 1, 130, 20, 8), torch.float32, seed=9)
    assert_nan_row_70_propagates(q, k, v, precision)


def assert_nan_row_70_propagates(q, k, v, precision):
    """A NaN in row 70 of q (one head, 130 rows) makes that row NaN, or in 8 bits its 64-row
    quantization block's; the other rows stay finite."""
    q[0, 0, 70, 5] = float("nan")
    nan_rows = ltx_kernels.attention(q, k, v, precision=precision)[0, 0].isnan().all(dim=-1)
    expected = torch.zeros(130, dtype=torch.bool, device=q.device)
    expected[70] = True
    if precision == "8bit":
        expected[64:128] = True
    assert torch.equal(nan_rows, expected)


def test_8bit_bf16_inputs():
    q, k, v = qkv((1, 2, 2, 100, 100, 64), torch.bfloat16, seed=3)
    out = ltx_kernels.attention(q, k, v, precision="8bit")
    assert out.dtype == torch.bfloat16
    assert_close(out, int8_attention(q, k, v), torch.bfloat16)


def test_meta_shapes_and_empty():
    q = torch.empty(2, 4, 7, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 2, 5, 64, device="meta", dtype=torch.bfloat16)
    out = ops.attention(q, k, k, None, None, "8bit")
    assert out.shape == q.shape and out.dtype == q.dtype
    empty = ltx_kernels.attention(torch.randn(2, 1, 0, 8), torch.randn(2, 1, 3, 8), torch.randn(2, 1, 3, 8))
    assert empty.shape == (2, 1, 0, 8)


def test_bad_input_names_the_argument():
    q, k, v = qkv((1, 2, 2, 5, 5, 16), torch.float32)
    with pytest.raises(ValueError, match="attention: precision must be 'bf16' or '8bit'"):
        ltx_kernels.attention(q, k, v, precision="int4")
    with pytest.raises(ValueError, match="q must be \\[B, H, S, D\\]"):
        ltx_kernels.attention(q[0], k, v)
    with pytest.raises(ValueError, match="q's heads must be a multiple of k's"):
        ltx_kernels.attention(q, torch.randn(1, 3, 5, 16), torch.randn(1, 3, 5, 16))
    with pytest.raises(ValueError, match="v must have the shape of k"):
        ltx_kernels.attention(q, k, v[:, :, :4])
    with pytest.raises(TypeError, match="k must have q's dtype"):
        ltx_kernels.attention(q, k.half(), v.half())
    with pytest.raises(ValueError, match="attn_mask must broadcast"):
        ltx_kernels.attention(q, k, v, attn_mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        ltx_kernels.attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.int32))
    with pytest.raises(TypeError, match="attention: scale must be a real number"):
        ltx_kernels.attention(q, k, v, scale="0.1")


# ---- the backward (both precisions: the exact attention's gradient) ----


def sdpa64_grads(q, k, v, grad_out, mask=None, scale=None):
    """Autograd of SDPA in fp64 (math): the gradients of q, k, v and of a floating mask; rows
    whose keys are all masked give zero gradients (SDPA gives NaN)."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    m = mask.detach().double().requires_grad_() if mask is not None and mask.is_floating_point() else mask
    out = F.scaled_dot_product_attention(*leaves, attn_mask=m, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    out.backward(grad_out.double())
    grads = [t.grad.nan_to_num(0.0) for t in leaves]
    return grads + ([m.grad.nan_to_num(0.0)] if m is not None and m.is_floating_point() else [])


def ours_grads(q, k, v, grad_out, mask=None, scale=None, precision="bf16"):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    m = mask.detach().clone().requires_grad_() if mask is not None and mask.is_floating_point() else mask
    ltx_kernels.attention(*leaves, attn_mask=m, scale=scale, precision=precision).backward(grad_out)
    return [t.grad for t in leaves] + ([m.grad] if m is not None and m.is_floating_point() else [])


@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_backward_matches_sdpa(precision, dtype, shape):
    """The 8-bit precision's gradient is the exact attention's (straight through its rounding)."""
    q, k, v = qkv(shape, dtype, seed=11)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(12)).to(dtype)
    grads = ours_grads(q, k, v, grad_out, scale=0.2, precision=precision)
    for got, want, x in zip(grads, sdpa64_grads(q, k, v, grad_out, scale=0.2), (q, k, v)):
        assert got.dtype == dtype and got.shape == x.shape
        assert_close(got, want, dtype)


def test_backward_of_8bit_is_the_exact_gradient():
    q, k, v = qkv((1, 4, 2, 70, 90, 64), torch.float32, seed=13)
    grad_out = torch.randn(q.shape)
    for exact, straight_through in zip(ours_grads(q, k, v, grad_out), ours_grads(q, k, v, grad_out, precision="8bit")):
        assert torch.equal(exact, straight_through)


def test_backward_masks_and_fully_masked_rows():
    """A bool padding mask, a float mask broadcast from [Sq, Sk] (its gradient summed over the
    batch and heads it broadcasts along) and a [B, 1, Sq, Sk] one, and a row with every key
    masked: zero gradients there, finite everywhere."""
    q, k, v = qkv((2, 2, 2, 9, 13, 64), torch.float32, seed=14)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(15))
    padding = torch.ones(2, 1, 1, 13, dtype=torch.bool)
    padding[1, ..., 5:] = False
    rows = torch.ones(2, 2, 9, 13, dtype=torch.bool)
    rows[0, 1, 3] = False
    for mask in (padding, rows, torch.randn(9, 13), torch.randn(2, 1, 9, 13)):
        got, want = ours_grads(q, k, v, grad_out, mask), sdpa64_grads(q, k, v, grad_out, mask)
        assert len(got) == len(want) == (4 if mask.is_floating_point() else 3)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.isfinite(g).all()
            assert_close(g, w, torch.float32)
    dq = ours_grads(q, k, v, grad_out, rows)[0]
    assert (dq[0, 1, 3] == 0).all()


def test_backward_in_chunks():
    """Long sequences run in chunks of heads and of query rows: a GQA group split between two
    head chunks (10 q heads, 8 to a chunk at 2048 x 2048, 2 kv heads), and a 6000 x 5800 head
    in two row chunks; the gradients are those of one piece. (fp32 sums over thousands of keys
    and queries: the tolerance scale of 10 that test_backward.py gives reductions over rows.)"""
    for shape in ((1, 10, 2, 2048, 2048, 8), (1, 1, 1, 6000, 5800, 8)):
        q, k, v = qkv(shape, torch.float32, seed=16)
        grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(17))
        for got, want in zip(ours_grads(q, k, v, grad_out), sdpa64_grads(q, k, v, grad_out)):
            assert_close(got, want, torch.float32, scale=10.0)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
def test_backward_strided_views_and_gradcheck():
    """Views of a fused projection get the contiguous inputs' gradients; finite differences in
    fp32 (the op takes no fp64) agree within eps = 1e-3, atol = 1e-3, rtol = 1e-2."""
    q, k, v = qkv((2, 3, 3, 40, 40, 64), torch.float32, seed=18, layout="fused")
    grad_out = torch.randn(q.shape)
    for a, b in zip(ours_grads(q, k, v, grad_out), ours_grads(q.contiguous(), k.contiguous(), v.contiguous(), grad_out)):
        assert torch.equal(a, b)
    g = torch.Generator().manual_seed(19)
    inputs = [torch.randn(*shape, generator=g).requires_grad_() for shape in ((1, 2, 5, 8), (1, 1, 4, 8), (1, 1, 4, 8),
                                                                               (5, 4))]
    assert torch.autograd.gradcheck(lambda q, k, v, m: ltx_kernels.attention(q, k, v, attn_mask=m), inputs,
                                    eps=1e-3, atol=1e-3, rtol=1e-2)


def test_backward_under_torch_compile():
    """AOTAutograd traces the op and its backward op (no graph break): the same gradients."""
    q, k, v = qkv((1, 4, 2, 33, 40, 64), torch.float32, seed=21)
    mask = torch.randn(33, 40)
    grad_out = torch.randn(q.shape)
    eager = ours_grads(q, k, v, grad_out, mask)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, mask)]
    fn = torch.compile(lambda q, k, v, m: ltx_kernels.attention(q, k, v, attn_mask=m), fullgraph=True,
                       backend="aot_eager")
    fn(*leaves).backward(grad_out)
    for got, want in zip((t.grad for t in leaves), eager):
        assert torch.equal(got, want)


def test_backward_meta_and_bad_input():
    q = torch.empty(2, 4, 7, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 2, 5, 64, device="meta", dtype=torch.bfloat16)
    grads = ops.attention_backward(q, q, k, k, torch.empty(7, 5, device="meta"), None, "8bit")
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape, (7, 5)]
    assert ops.attention_backward(q, q, k, k, None, None, "bf16")[3].numel() == 0  # none_grad: no mask
    bool_mask = torch.ones(7, 5, dtype=torch.bool, device="meta")
    assert ops.attention_backward(q, q, k, k, bool_mask, None, "bf16")[3].numel() == 0
    q, k, v = qkv((1, 2, 2, 5, 5, 16), torch.float32)
    with pytest.raises(ValueError, match="attention_backward: grad_out must have the output's shape"):
        ops.attention_backward(q[:, :, :4], q, k, v, None, None, "bf16")
    with pytest.raises(TypeError, match="attention_backward: grad_out must have q's dtype"):
        ops.attention_backward(q.half(), q, k, v, None, None, "bf16")
    with pytest.raises(ValueError, match="attention: precision must be 'bf16' or '8bit'"):
        ops.attention_backward(q, q, k, v, None, None, "int4")


# ---- the CUDA kernel ----

def test_integration_limits_are_the_kernels():
    """The limits the integrations route by (ltx_kernels.ops.ATTENTION_*: the LTX processor's
    short-key cross-attention, transformers' decode steps) are the CUDA launcher's
    (src/ops/attention_workspace.h): a change to one side alone fails here."""
    header = (Path(__file__).resolve().parents[2] / "src" / "ops" / "attention_workspace.h").read_text()
    constants = {name: int(value) for name, value in re.findall(r"constexpr int64_t (k\w+) = (\d+);", header)}
    assert constants["kShortMaxKeys"] == ltx_kernels.ops.ATTENTION_SHORT_KEYS
    assert constants["kDecodeMaxRows"] == ltx_kernels.ops.ATTENTION_DECODE_ROWS
    assert constants["kDecodeMinKeys"] == ltx_kernels.ops.ATTENTION_DECODE_MIN_KEYS


cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
CUDA_DTYPES = [torch.bfloat16, torch.float16]
# (B, Hq, Hkv, Sq, Sk, D): single token, odd lengths around the 64-row tiles, GQA,
# cross-attention (Sq != Sk), a long odd sequence.
CUDA_SHAPES = [(1, 1, 1, 1, 1, 64), (2, 4, 4, 7, 7, 128), (1, 2, 1, 129, 65, 64), (1, 4, 2, 70, 200, 128),
               (2, 2, 2, 64, 128, 64), (1, 2, 2, 8063, 8063, 64)]


def on_cuda(*tensors):
    return tuple(t.cuda() for t in tensors)


def formula(precision):
    """The plain-torch statement of the precision, evaluated in fp64 where the inputs live."""
    return sdpa64 if precision == "bf16" else int8_attention


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("shape", CUDA_SHAPES)
def test_cuda_matches_the_formula(precision, dtype, shape):
    if shape[3] > 1000 and dtype == torch.float16:
        pytest.skip("the long sequence runs once, in bf16")
    q, k, v = on_cuda(*qkv(shape, dtype, seed=4))
    out = ltx_kernels.attention(q, k, v, precision=precision)
    assert out.dtype == dtype and out.shape == q.shape and out.device == q.device
    assert_close(out, formula(precision)(q, k, v), dtype)


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_cuda_nan_propagates(precision, dtype, d):
    """As test_nan_propagates, on the kernels that walk the keys (200 keys, 130 rows): the NaN
    survives the rounding of P for the tensor cores and the row sums."""
    assert_nan_row_70_propagates(*on_cuda(*qkv((1, 1, 1, 130, 200, d), dtype, seed=9)), precision)


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
def test_cuda_matches_the_cpu_reference(precision, dtype):
    """The GPU kernel against the C++ reference (in fp32, on the same values)."""
    q, k, v = qkv((2, 4, 2, 100, 77, 128), dtype, seed=5)
    ref = ltx_kernels.attention(q.float(), k.float(), v.float(), precision=precision)
    out = ltx_kernels.attention(*on_cuda(q, k, v), precision=precision)
    assert_close(out, ref, dtype)


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@pytest.mark.parametrize("d", [64, 128])
def test_cuda_masks_and_fully_masked_rows(precision, d):
    q, k, v = on_cuda(*qkv((2, 2, 2, 70, 128, d), torch.bfloat16, seed=6))
    padding = torch.ones(2, 1, 1, 128, dtype=torch.bool, device="cuda")
    padding[1, ..., 77:] = False  # cross-attention key padding (LTX's text length 128)
    additive = torch.randn(70, 128, device="cuda")
    rows = torch.ones(2, 2, 70, 128, dtype=torch.bool, device="cuda")
    rows[0, 1, 3] = False  # one query row with every key masked
    rows[1, 0, 69, :64] = False  # a row whose first key tile is all masked
    for mask in (padding, additive, rows):
        out = ltx_kernels.attention(q, k, v, attn_mask=mask, precision=precision)
        assert_close(out, formula(precision)(q, k, v, mask), torch.bfloat16)
    out = ltx_kernels.attention(q, k, v, attn_mask=rows, precision=precision)
    assert (out[0, 1, 3] == 0).all() and torch.isfinite(out).all()


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("seq", [190, 383])
def test_cuda_wide_tiles(precision, dtype, seq):
    """At head_dim 64 the kernel takes 192 query rows per CTA (three consumer warpgroups)
    where that leaves the grid's last wave no emptier; the small shapes above all take 128.
    One head per SM and these lengths make 192 the choice on any GPU (1 wide wave vs 2
    narrow ones at 190; 2 vs 3 at 383): the last wide block partial, a padding mask too."""
    heads = torch.cuda.get_device_properties(0).multi_processor_count
    q, k, v = on_cuda(*qkv((1, heads, heads, seq, seq, 64), dtype, seed=9))
    assert_close(ltx_kernels.attention(q, k, v, precision=precision), formula(precision)(q, k, v), dtype)
    padding = (torch.arange(seq, device="cuda") < seq - 100)[None, None, None, :]
    out = ltx_kernels.attention(q, k, v, attn_mask=padding, precision=precision)
    assert_close(out, formula(precision)(q, k, v, padding), dtype)


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("keys", [100, 129, 300, 640])
def test_cuda_persistent_tiles(precision, dtype, d, keys):
    """The Hopper kernel is persistent: one CTA per SM takes every grid-th tile, its Q buffer
    and its ring of K/V stages carried from tile to tile. More than three tiles per CTA, 1 to 5
    key steps a tile (so the ring's position moves by a different amount per tile; 100 keys
    in bf16 run the short-key kernel), 17 query heads per kv head, a partial last query block
    and a padding mask per sample: a tile that read another tile's Q, a stale stage, another
    head's scales or mask row shows against the formula (such an element is off by the output's
    own scale). The element bound is relative to the sum of |P V| terms, as for any output of
    P rounded to the input dtype: over these ~4M elements, bf16's rounding of P alone took five
    elements to 1.04-1.2x the bound relative to |out| (H100; the same elements and values with
    the one-CTA-per-tile kernel before this one)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hkv = 4
    hq = hkv * (sms // 8 + 1)  # x 3 or 4 query blocks x 2 samples: > 3 tiles per SM
    q, k, v = on_cuda(*qkv((2, hq, hkv, 450, keys, d), dtype, seed=13))
    ref = formula(precision)
    assert_close(ltx_kernels.attention(q, k, v, precision=precision), ref(q, k, v), dtype,
                 magnitude=ref(q, k, v.abs()))
    padding = (torch.arange(keys, device="cuda")[None, None, None, :]
               < torch.tensor([keys - 7, keys // 2], device="cuda")[:, None, None, None])
    out = ltx_kernels.attention(q, k, v, attn_mask=padding, precision=precision)
    assert_close(out, ref(q, k, v, padding), dtype, magnitude=ref(q, k, v.abs(), padding))


@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("shape", [(2, 16, 16, 2001, 128), (3, 8, 2, 700, 1), (1, 40, 40, 333, 127)])
def test_cuda_short_key_kernel(dtype, d, shape):
    """At most 128 keys (a DiT's text cross-attention), exact precision runs the short-key
    kernel: CTAs persistent over more (batch, head, 64-row tile) items than the GPU holds, so
    that each walks several tiles of one head and then moves on to another head's keys (GQA:
    heads sharing them); against the formula, with LTX's key padding mask (one row of key
    biases per sample) and with a key bias per head too."""
    b, hq, hkv, sq, sk = shape
    q, k, v = on_cuda(*qkv((b, hq, hkv, sq, sk, d), dtype, seed=11))
    assert_close(ltx_kernels.attention(q, k, v), sdpa64(q, k, v), dtype)
    padding = torch.arange(sk, device="cuda")[None, None, None, :] < torch.tensor([sk, 1 + sk // 2, 1][:b],
                                                                                  device="cuda")[:, None, None, None]
    assert_close(ltx_kernels.attention(q, k, v, attn_mask=padding), sdpa64(q, k, v, padding), dtype)
    # A key bias of each head's own: sharper rows, whose outputs can be small sums of large
    # terms, each term off by P's rounding to the input dtype (as in every kernel that feeds
    # P to the tensor cores): the element bound is relative to the sum of |P V| terms.
    per_head = torch.randn(b, hq, 1, sk, generator=torch.Generator().manual_seed(12)).cuda()
    assert_close(ltx_kernels.attention(q, k, v, attn_mask=per_head), sdpa64(q, k, v, per_head), dtype,
                 magnitude=sdpa64(q, k, v.abs(), per_head))


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
@pytest.mark.parametrize("d", [64, 128])
def test_cuda_scores_that_keep_growing(precision, d):
    """The kernel moves a row's running max only when a score exceeds it by more than 2^8
    (lazy rescaling): scores that grow along the keys make it move at every step, and one
    key far above the rest makes it move once, late; both against the formula."""
    g = torch.Generator().manual_seed(10)
    q = torch.randn(1, 2, 300, d, generator=g).abs() + 0.5
    ramp = torch.linspace(0.0, 12.0, 1000)[None, None, :, None]  # scores up to ~12 sqrt(d)
    k = ramp * (torch.rand(1, 2, 1000, d, generator=g) + 0.5)
    spike = torch.randn(1, 2, 1000, d, generator=g) * 0.3
    spike[:, :, 777] = 3.0  # one key ~30 log2 units above the others
    v = torch.randn(1, 2, 1000, d, generator=g)
    for keys in (k, spike):
        qc, kc, vc = (t.bfloat16().cuda() for t in (q, keys, v))
        out = ltx_kernels.attention(qc, kc, vc, precision=precision)
        assert_close(out, formula(precision)(qc, kc, vc), torch.bfloat16)


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
def test_cuda_strided_and_misaligned_views(precision):
    """Views of a fused QKV projection run in place; views whose rows are not 16-byte aligned
    are copied first: both give the contiguous result exactly."""
    q, k, v = qkv((2, 3, 3, 100, 100, 64), torch.bfloat16, layout="fused")
    q, k, v = on_cuda(q, k, v)
    same = ltx_kernels.attention(q.contiguous(), k.contiguous(), v.contiguous(), precision=precision)
    assert torch.equal(ltx_kernels.attention(q, k, v, precision=precision), same)
    wide = torch.zeros(2, 3, 100, 65, dtype=torch.bfloat16, device="cuda")
    wide[..., 1:] = q
    assert torch.equal(ltx_kernels.attention(wide[..., 1:], k, v, precision=precision), same)


@cuda
@pytest.mark.parametrize("d", [64, 128])
def test_cuda_8bit_error_within_the_targets(d):
    q, k, v = on_cuda(*qkv((1, 2, 2, 1000, 1000, d), torch.float32, seed=7))
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    err = rel_err(ltx_kernels.attention(q, k, v, precision="8bit"), sdpa64(q, k, v))
    assert 1e-4 < err <= ERROR_RANDN, err
    q, k, v = (t.cuda().bfloat16() for t in outlier_qkv(1, 2, 1000, d))
    err = rel_err(ltx_kernels.attention(q, k, v, precision="8bit"), sdpa64(q, k, v))
    assert 1e-4 < err <= ERROR_OUTLIER, err


@cuda
@pytest.mark.parametrize("precision", ["bf16", "8bit"])
def test_cuda_nan_propagates_as_the_reference_says(precision):
    """A NaN in q poisons its row (bf16) or its 64-row quantization block (8-bit); a NaN in
    k poisons every row. The GPU's NaN pattern is the C++ reference's."""
    q, k, v = qkv((1, 1, 1, 130, 90, 64), torch.bfloat16, seed=8)
    q[0, 0, 70, 5] = float("nan")
    ref = ltx_kernels.attention(q.float(), k.float(), v.float(), precision=precision)
    out = ltx_kernels.attention(*on_cuda(q, k, v), precision=precision).cpu()
    assert torch.equal(out.isnan(), ref.isnan()) and out.isnan().any() and not out.isnan().all()
    k[0, 0, 10, 0] = float("nan")
    assert ltx_kernels.attention(*on_cuda(q, k, v), precision=precision).isnan().all()


@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("shape", [(2, 32, 8, 1, 8193), (1, 8, 8, 1, 512), (3, 4, 1, 4, 1000), (1, 16, 1, 1, 700)])
def test_cuda_decode_kernel(dtype, d, shape):
    """A decode step (at most 16 query rows per kv head: tokens x grouped query heads) against
    512 keys or more runs the decode kernel: the keys split in chunks of 64 across CTAs, each
    taking every query head of its kv head, then combined. Against SDPA in fp64: GQA (groups of
    1 to 16), a partial last chunk, a StaticCache-style mask (the slots past each sequence's
    length masked), an additive mask of its own per query head, a row with every key masked, a
    view of a larger cache."""
    b, hq, hkv, sq, sk = shape
    q, k, v = on_cuda(*qkv((b, hq, hkv, sq, sk, d), dtype, seed=21))
    assert_close(ltx_kernels.attention(q, k, v), sdpa64(q, k, v), dtype)
    lengths = torch.tensor([sk, sk // 2 + 3, 257][:b], device="cuda")
    filled = (torch.arange(sk, device="cuda") < lengths[:, None])[:, None, None, :]
    assert_close(ltx_kernels.attention(q, k, v, attn_mask=filled), sdpa64(q, k, v, filled), dtype)
    bias = torch.randn(b, hq, sq, sk, generator=torch.Generator().manual_seed(22)).cuda()
    assert_close(ltx_kernels.attention(q, k, v, attn_mask=bias), sdpa64(q, k, v, bias), dtype,
                 magnitude=sdpa64(q, k, v.abs(), bias))
    rows = filled.expand(b, hq, sq, sk).clone()
    rows[0, hq - 1, sq - 1] = False  # one query row with every key masked
    out = ltx_kernels.attention(q, k, v, attn_mask=rows)
    assert_close(out, sdpa64(q, k, v, rows), dtype)
    assert (out[0, hq - 1, sq - 1] == 0).all() and torch.isfinite(out).all()
    cache = torch.randn(b, hkv, sk + 40, d, device="cuda").to(dtype)  # a longer cache, read up to sk
    assert_close(ltx_kernels.attention(q, cache[:, :, :sk], v), sdpa64(q, cache[:, :, :sk], v), dtype)


@cuda
def test_cuda_decode_kernel_nan_propagates_as_the_reference_says():
    q, k, v = qkv((1, 8, 2, 1, 600, 64), torch.bfloat16, seed=23)
    q[0, 5, 0, 3] = float("nan")  # one query head's row
    ref = ltx_kernels.attention(q.float(), k.float(), v.float())
    out = ltx_kernels.attention(*on_cuda(q, k, v)).cpu()
    assert torch.equal(out.isnan(), ref.isnan()) and out.isnan().any() and not out.isnan().all()
    k[0, 1, 555, 0] = float("nan")  # a key of kv head 1: its four query heads
    nan_heads = ltx_kernels.attention(*on_cuda(q, k, v)).isnan().all(dim=-1)[0, :, 0].cpu()
    assert torch.equal(nan_heads, torch.tensor([False, False, False, False, True, True, True, True]))


@cuda
def test_cuda_empty_and_keyless_inputs():
    q = torch.randn(2, 1, 5, 64, device="cuda", dtype=torch.bfloat16)
    none = torch.randn(2, 1, 0, 64, device="cuda", dtype=torch.bfloat16)
    for precision in ("bf16", "8bit"):
        assert ltx_kernels.attention(none, q, q, precision=precision).shape == (2, 1, 0, 64)
        assert (ltx_kernels.attention(q, none, none, precision=precision) == 0).all()


@cuda
def test_cuda_unsupported_inputs_raise():
    q = torch.randn(1, 2, 8, 64, device="cuda")
    with pytest.raises(TypeError, match="attention: on CUDA, q, k and v must be bfloat16 or float16"):
        ltx_kernels.attention(q, q, q)
    q = torch.randn(1, 2, 8, 80, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="attention: on CUDA, head_dim must be 64 or 128, got 80"):
        ltx_kernels.attention(q, q, q)
    with pytest.raises(ValueError, match="attn_mask must be on q's device"):
        ltx_kernels.attention(q[..., :64], q[..., :64], q[..., :64], attn_mask=torch.ones(8, 8, dtype=torch.bool))


@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
def test_cuda_backward_matches_sdpa(dtype):
    """The backward on the GPU (the same composite of torch ops): GQA, cross-attention padding."""
    q, k, v = on_cuda(*qkv((2, 4, 2, 129, 65, 64), dtype, seed=20))
    grad_out = torch.randn(q.shape, device="cuda").to(dtype)
    padding = torch.ones(2, 1, 1, 65, dtype=torch.bool, device="cuda")
    padding[1, ..., 40:] = False
    for got, want in zip(ours_grads(q, k, v, grad_out, padding), sdpa64_grads(q, k, v, grad_out, padding)):
        assert got.device == q.device
        assert_close(got, want, dtype)

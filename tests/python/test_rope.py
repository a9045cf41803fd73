"""Rotary embeddings: LLM (tables from the model), rope_1d / rope_3d, and LTX-Video's RoPE
(diffusers' tables, angles in the kernel, and the fused QK norm + RoPE)."""

import math

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, DTYPES, HAS_CUDA, assert_close, rel_err, TOLERANCE

ops = torch.ops.ltx_kernels


# ---- PyTorch formulas (fp64) ----


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_interleaved(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def llm_rope_formula(x, cos, sin, unsqueeze_dim, interleaved):
    """transformers' apply_rotary_pos_emb, with partial rotary (channels >= R pass through)."""
    x = x.double()
    r = cos.shape[-1]
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos.double().unsqueeze(unsqueeze_dim), sin.double().unsqueeze(unsqueeze_dim)
    rot, rest = x[..., :r], x[..., r:]
    rotate = rotate_interleaved if interleaved else rotate_half
    return torch.cat((rot * cos + rotate(rot) * sin, rest), dim=-1)


def make_qk(layout, b, s, hq, hk, dh, dtype, device):
    """q [B, H, S, Dh] (layout 'bhsd', 'fused_bhsd') or [B, S, H, Dh] ('bshd', 'fused_bshd');
    fused: views of one [B, S, (Hq + 2 Hk) * Dh] QKV projection."""
    if layout.startswith("fused"):
        qkv = torch.randn(b, s, (hq + 2 * hk) * dh, dtype=dtype, device=device)
        q = qkv[..., : hq * dh].unflatten(-1, (hq, dh))
        k = qkv[..., hq * dh : (hq + hk) * dh].unflatten(-1, (hk, dh))
    else:
        q = torch.randn(b, s, hq, dh, dtype=dtype, device=device)
        k = torch.randn(b, s, hk, dh, dtype=dtype, device=device)
    if layout.endswith("bhsd"):
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if layout == "bhsd":
            q, k = q.contiguous(), k.contiguous()
    return q, k


def make_tables(kind, b, s, r, dtype, device):
    """cos/sin as a model's rotary module returns them: duplicated halves of angles."""
    angles = torch.randn(b if kind == "batched" else 1, s, r // 2, dtype=torch.float64, device=device) * 20
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    if kind == "shared_2d":
        return cos[0], sin[0]
    return cos, sin


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd", "fused_bhsd", "fused_bshd"])
@pytest.mark.parametrize("dh,r", [(128, 128), (64, 32), (80, 80), (6, 6), (10, 4)])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("table", ["batched", "shared", "shared_2d"])
@pytest.mark.parametrize("table_fp32", [False, True])
def test_apply_rotary_pos_emb(device, dtype, layout, dh, r, interleaved, table, table_fp32):
    b, s, hq, hk = 2, 5, 4, 2  # GQA: fewer key heads
    q, k = make_qk(layout, b, s, hq, hk, dh, dtype, device)
    cos, sin = make_tables(table, b, s, r, torch.float32 if table_fp32 else dtype, device)
    unsqueeze_dim = 1 if layout.endswith("bhsd") else 2
    q_out, k_out = ltx_kernels.apply_rotary_pos_emb(q, k, cos, sin, interleaved, unsqueeze_dim)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.is_contiguous()
    assert_close(q_out, llm_rope_formula(q, cos, sin, unsqueeze_dim, interleaved), dtype)
    assert_close(k_out, llm_rope_formula(k, cos, sin, unsqueeze_dim, interleaved), dtype)


def test_apply_rotary_pos_emb_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = make_qk("bhsd", 2, 7, 8, 2, 64, torch.float32, "cpu")
    cos, sin = make_tables("batched", 2, 7, 64, torch.float32, "cpu")
    for got, want in zip(ltx_kernels.apply_rotary_pos_emb(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)):
        assert_close(got, want, torch.float32)
    del transformers


def rope_1d_formula(x, theta):
    """The original package's formula: interleaved pairs, positions 0..S-1."""
    s, dh = x.shape[1], x.shape[-1]
    freqs = theta ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angles = torch.arange(s, dtype=torch.float64)[:, None] * freqs[None]
    z = torch.view_as_complex(x.double().cpu().unflatten(-1, (-1, 2)).contiguous())
    rotated = z * torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    return torch.view_as_real(rotated).flatten(-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dh", [2, 64, 128])
def test_rope_1d(device, dtype, dh):
    q = torch.randn(2, 33, 3, dh, dtype=dtype, device=device)
    k = torch.randn(2, 33, 1, dh, dtype=dtype, device=device)
    q_out, k_out = ltx_kernels.rope_1d(q, k, 500.0)
    assert_close(q_out, rope_1d_formula(q, 500.0), dtype)
    assert_close(k_out, rope_1d_formula(k, 500.0), dtype)


def rope_3d_formula(x, f, h, w, theta):
    """rope_3d's definition, section by section (rotate_half within each section)."""
    x = x.double().cpu()
    dh = x.shape[-1]
    t = (dh // 3) // 2 * 2
    sizes = [t, t, (dh - 2 * t) // 2 * 2]
    ff, hh, ww = torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij")
    out = x.clone()
    start = 0
    for pos, n in zip((ff.reshape(-1), hh.reshape(-1), ww.reshape(-1)), sizes):
        if n:
            half = n // 2
            freqs = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / n)
            ang = (pos.double()[:, None] * freqs[None])[None, :, None, :]
            x1, x2 = x[..., start : start + half], x[..., start + half : start + n]
            out[..., start : start + half] = x1 * ang.cos() - x2 * ang.sin()
            out[..., start + half : start + n] = x2 * ang.cos() + x1 * ang.sin()
        start += n
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dh", [128, 64, 7, 6, 36])
def test_rope_3d(device, dtype, dh):
    f, h, w = 3, 4, 5
    q = torch.randn(2, f * h * w, 3, dh, dtype=dtype, device=device)
    k = torch.randn(2, f * h * w, 2, dh, dtype=dtype, device=device)
    q_out, k_out = ltx_kernels.rope_3d(q, k, f, h, w)
    assert_close(q_out, rope_3d_formula(q, f, h, w, 10000.0), dtype)
    assert_close(k_out, rope_3d_formula(k, f, h, w, 10000.0), dtype)
    assert sum(ltx_kernels.rope_3d_sections(dh)) <= dh


# ---- LTX-Video ----


def ltx_tables_fp64(b, s, d, grid, axis_scale, coords=None, theta=10000.0, device="cpu"):
    """cos/sin [B, S, D] of LTX-Video's RoPE evaluated in fp64 (DESIGN.md section 3)."""
    nfreq = d // 6
    exponent = torch.arange(nfreq, dtype=torch.float64) / (nfreq - 1) if nfreq > 1 else torch.zeros(nfreq, dtype=torch.float64)
    freq = theta**exponent * math.pi / 2
    scale = torch.tensor(axis_scale, dtype=torch.float64)[None, :, None]
    if coords is not None:
        pos = coords.double().cpu()
    else:
        f, h, w = grid
        mesh = torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij")
        pos = torch.stack([m.reshape(-1) for m in mesh]).double()[None].expand(b, 3, s)
    m = (2 * pos * scale - 1).transpose(1, 2)  # [B, S, 3]
    angles = (freq[None, None, :, None] * m[:, :, None, :]).flatten(2)  # j = 3k + a
    cos = angles.cos().repeat_interleave(2, -1)
    sin = angles.sin().repeat_interleave(2, -1)
    pad = d % 6
    cos = torch.cat((torch.ones(b, s, pad, dtype=torch.float64), cos), -1)
    sin = torch.cat((torch.zeros(b, s, pad, dtype=torch.float64), sin), -1)
    return cos, sin


def ltx_rope_formula(x, cos, sin):
    """x * cos + rotate(x) * sin with every pair interleaved, as diffusers' LTX computes it; its
    tables make the D % 6 leading channels pass through (cos 1, sin 0), which only a table's own
    gradient tells apart from not rotating them (d / d sin there is grad * rotate(x)). An odd D
    (the angle forms take one) leaves its first channel out of the pairs."""
    x = x.double().cpu()
    odd = x.shape[-1] % 2
    rotated = torch.cat((torch.zeros_like(x[..., :odd]), rotate_interleaved(x[..., odd:])), -1)
    return x * cos + rotated * sin


def rms_formula(x, weight, eps):
    x = x.double().cpu()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.double().cpu()


POSITIONS = ["raw", "interpolated", "coords"]


def ltx_positions(kind, b, grid, device):
    """(kwargs for our API, (rope_interpolation_scale, video_coords) for diffusers, axis_scale)."""
    f, h, w = grid
    if kind == "raw":
        return {}, (None, None), (1.0, 1.0, 1.0)
    if kind == "interpolated":
        r = (8 / 25, 32.0, 32.0)  # what the LTX pipelines pass: (temporal / fps, spatial, spatial)
        return {"rope_interpolation_scale": r}, (r, None), (r[0] / 20, r[1] / 2048, r[2] / 2048)
    coords = torch.rand(b, 3, f * h * w, device=device) * torch.tensor([160.0, 512.0, 768.0], device=device)[None, :, None]
    return {"video_coords": coords}, (None, coords), (1 / 20, 1 / 2048, 1 / 2048)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [2048, 4096, 64, 67, 5, 6, 12, 9])
@pytest.mark.parametrize("kind", POSITIONS)
def test_ltx_rope_angles_vs_fp64(device, dtype, d, kind):
    b, grid = 2, (3, 4, 5)
    s = grid[0] * grid[1] * grid[2]
    x = torch.randn(b, s, d, dtype=dtype, device=device)
    kwargs, _, axis_scale = ltx_positions(kind, b, grid, device)
    out = ltx_kernels.ltx_rope_angles(x, *grid, **kwargs)
    cos, sin = ltx_tables_fp64(b, s, d, grid, axis_scale, kwargs.get("video_coords"))
    assert_close(out, ltx_rope_formula(x, cos, sin), dtype)



def diffusers_rope():
    transformer_ltx = pytest.importorskip("diffusers.models.transformers.transformer_ltx")
    return transformer_ltx.LTXVideoRotaryPosEmbed, transformer_ltx.apply_rotary_emb


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [2048, 4096])
@pytest.mark.parametrize("kind", POSITIONS)
def test_ltx_rope_vs_diffusers(device, dtype, d, kind):
    RotaryPosEmbed, apply_rotary_emb = diffusers_rope()
    b, grid = 2, (3, 4, 5)
    s = grid[0] * grid[1] * grid[2]
    x = torch.randn(b, s, d, dtype=dtype, device=device)
    kwargs, (r, coords), axis_scale = ltx_positions(kind, b, grid, device)
    cos, sin = RotaryPosEmbed(d)(x, *grid, rope_interpolation_scale=r, video_coords=coords)
    stock = apply_rotary_emb(x, (cos, sin))
    # Given diffusers' own tables, ltx_rope is diffusers' apply_rotary_emb.
    assert_close(ltx_kernels.ltx_rope(x, cos, sin), stock, dtype)
    # With angles in the kernel, ours is closer to the exact (fp64) result than stock, and
    # differs from stock by no more than stock's own table error.
    exact = ltx_rope_formula(x, *ltx_tables_fp64(b, s, d, grid, axis_scale, coords))
    ours = ltx_kernels.ltx_rope_angles(x, *grid, **kwargs)
    assert rel_err(ours, exact) <= rel_err(stock, exact) * 1.1 + TOLERANCE[dtype] / 10
    assert rel_err(ours, stock) <= rel_err(stock, exact) * 1.1 + TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [2048, 4096, 64, 67, 6])
@pytest.mark.parametrize("kind", POSITIONS)
@pytest.mark.parametrize("weights", [True, False])
@pytest.mark.parametrize("strided", [False, True])
def test_ltx_qk_norm_rope_vs_fp64(device, dtype, d, kind, weights, strided):
    b, grid = 2, (2, 3, 4)
    s = grid[0] * grid[1] * grid[2]
    if strided:  # views of a fused [B, S, 3D] projection
        qkv = torch.randn(b, s, 3 * d, dtype=dtype, device=device)
        q, k = qkv[..., :d], qkv[..., d : 2 * d]
    else:
        q = torch.randn(b, s, d, dtype=dtype, device=device)
        k = torch.randn(b, s, d, dtype=dtype, device=device)
    wq = torch.randn(d, dtype=dtype, device=device) if weights else None
    wk = torch.randn(d, dtype=dtype, device=device) if weights else None
    kwargs, _, axis_scale = ltx_positions(kind, b, grid, device)
    q_out, k_out = ltx_kernels.ltx_qk_norm_rope(q, k, wq, wk, 1e-5, num_frames=grid[0], height=grid[1], width=grid[2], **kwargs)
    cos, sin = ltx_tables_fp64(b, s, d, grid, axis_scale, kwargs.get("video_coords"))
    assert_close(q_out, ltx_rope_formula(rms_formula(q, wq, 1e-5), cos, sin), dtype)
    assert_close(k_out, ltx_rope_formula(rms_formula(k, wk, 1e-5), cos, sin), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [2048, 4096])
@pytest.mark.parametrize("kind", POSITIONS)
def test_ltx_qk_norm_rope_no_worse_than_diffusers(device, dtype, d, kind):
    """Stock: norm_q / norm_k (torch RMSNorm across heads) then apply_rotary_emb with its
    fp32 tables, in low precision. Against the exact (fp64) result on the same inputs and
    weights, ours must be no worse than stock."""
    RotaryPosEmbed, apply_rotary_emb = diffusers_rope()
    b, grid = 2, (2, 3, 4)
    s = grid[0] * grid[1] * grid[2]
    kwargs, (r, coords), axis_scale = ltx_positions(kind, b, grid, device)
    norm_q = torch.nn.RMSNorm(d, eps=1e-5).to(device, dtype)
    norm_k = torch.nn.RMSNorm(d, eps=1e-5).to(device, dtype)
    with torch.no_grad():
        norm_q.weight.normal_(1.0, 0.2)
        norm_k.weight.normal_(1.0, 0.2)
    q = torch.randn(b, s, d, device=device, dtype=dtype)
    k = torch.randn(b, s, d, device=device, dtype=dtype)
    with torch.no_grad():
        freqs = RotaryPosEmbed(d)(q, *grid, rope_interpolation_scale=r, video_coords=coords)
        stock = apply_rotary_emb(norm_q(q), freqs), apply_rotary_emb(norm_k(k), freqs)
        ours = ltx_kernels.ltx_qk_norm_rope(q, k, norm_q.weight, norm_k.weight, 1e-5,
                                            num_frames=grid[0], height=grid[1], width=grid[2], **kwargs)
    cos, sin = ltx_tables_fp64(b, s, d, grid, axis_scale, coords)
    for x, norm, o, st in zip((q, k), (norm_q, norm_k), ours, stock):
        exact = ltx_rope_formula(rms_formula(x, norm.weight.detach(), 1e-5), cos, sin)
        assert rel_err(o, exact) <= rel_err(st, exact) * 1.1


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [2048, 4096, 67, 130, 40002])
@pytest.mark.parametrize("offset", [0, 1])
def test_ltx_cuda_matches_cpu_reference(dtype, d, offset):
    """offset 1: rows not 16-byte aligned (the kernel's scalar path); 40002: a frequency
    table beyond the default shared memory."""
    b, grid = 2, (2, 2, 3)
    s = 12
    base = torch.randn(b, s, 2 * d + offset, dtype=dtype, device="cuda")
    q, k = base[..., offset : offset + d], base[..., offset + d : offset + 2 * d]
    w = torch.randn(d, dtype=dtype, device="cuda")
    for kind in POSITIONS:
        kwargs, _, _ = ltx_positions(kind, b, grid, "cuda")
        cpu_kwargs = {key: (v.cpu() if torch.is_tensor(v) else v) for key, v in kwargs.items()}
        got = ltx_kernels.ltx_qk_norm_rope(q, k, w, None, 1e-5, num_frames=2, height=2, width=3, **kwargs)
        want = ltx_kernels.ltx_qk_norm_rope(q.cpu(), k.cpu(), w.cpu(), None, 1e-5, num_frames=2, height=2, width=3, **cpu_kwargs)
        for g, wnt in zip(got, want):
            assert_close(g, wnt, dtype)
        assert_close(ltx_kernels.ltx_rope_angles(q, *grid, **kwargs),
                     ltx_kernels.ltx_rope_angles(q.cpu(), *grid, **cpu_kwargs), dtype)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["bhsd", "fused_bshd"])
@pytest.mark.parametrize("dh,r", [(128, 128), (64, 32), (10, 4)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_table_cuda_matches_cpu_reference(dtype, layout, dh, r, interleaved):
    q, k = make_qk(layout, 2, 300, 8, 2, dh, dtype, "cuda")
    cos, sin = make_tables("batched", 2, 300, r, torch.float32, "cuda")
    unsqueeze_dim = 1 if layout.endswith("bhsd") else 2
    got = ltx_kernels.apply_rotary_pos_emb(q, k, cos, sin, interleaved, unsqueeze_dim)
    want = ltx_kernels.apply_rotary_pos_emb(q.cpu(), k.cpu(), cos.cpu(), sin.cpu(), interleaved, unsqueeze_dim)
    for g, w in zip(got, want):
        assert_close(g, w, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    q, k = make_qk("bhsd", 2, 6, 4, 2, 16, torch.float32, device)
    cos, sin = make_tables("batched", 2, 6, 16, torch.float32, device)
    x = torch.randn(2, 6, 36, device=device)
    tab = ltx_tables_fp64(2, 6, 36, (1, 2, 3), (1.0, 1.0, 1.0))
    tab = [t.float().to(device) for t in tab]
    coords = torch.rand(2, 3, 6, device=device) * 10
    w = torch.randn(36, device=device)
    torch.library.opcheck(ops.apply_rotary_pos_emb.default, (q, k, cos, sin, False, 1, None))
    torch.library.opcheck(ops.apply_rotary_pos_emb.default, (q, k, cos, sin, False, 1, [8, 4, 4]))
    torch.library.opcheck(ops.ltx_rope.default, (x, *tab))
    torch.library.opcheck(ops.ltx_rope_angles.default, (x, [1, 2, 3], [0.1, 0.2, 0.3], None, 10000.0))
    torch.library.opcheck(ops.ltx_rope_angles.default, (x, [1, 2, 3], [0.1, 0.2, 0.3], coords, 10000.0))
    torch.library.opcheck(ops.ltx_qk_norm_rope.default, (x, x * 2, w, None, 1e-5, [1, 2, 3], [0.1, 0.2, 0.3], None, 10000.0))

    def attention_inputs(q, k, cos, sin, x, w):
        q, k = ltx_kernels.apply_rotary_pos_emb(q * 2, k, cos, sin)
        s = x.shape[1]
        a, b = ltx_kernels.ltx_qk_norm_rope(x, x + 1, w, w, num_frames=1, height=1, width=s,
                                            rope_interpolation_scale=(0.32, 32, 32))
        return q.sum() + k.sum() + a + b + ltx_kernels.ltx_rope_angles(x, 1, s, 1)

    torch._dynamo.reset()
    compiled = torch.compile(attention_inputs, fullgraph=True, dynamic=True)
    for s in (6, 10):
        q, k = make_qk("bhsd", 2, s, 4, 2, 16, torch.float32, device)
        cos, sin = make_tables("batched", 2, s, 16, torch.float32, device)
        x = torch.randn(2, s, 36, device=device)
        assert_close(compiled(q, k, cos, sin, x, w), attention_inputs(q, k, cos, sin, x, w), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_names_the_argument(device):
    q, k = make_qk("bhsd", 2, 6, 4, 2, 16, torch.float32, device)
    cos, sin = make_tables("batched", 2, 6, 16, torch.float32, device)
    x = torch.randn(2, 6, 36, device=device)
    cases = [
        ("unsqueeze_dim must be 1", lambda: ltx_kernels.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=3)),
        ("q must be 4-dim", lambda: ltx_kernels.apply_rotary_pos_emb(q[0], k, cos, sin)),
        ("k must match q", lambda: ltx_kernels.apply_rotary_pos_emb(q, k[:, :, :3], cos, sin)),
        ("cos must have shape", lambda: ltx_kernels.apply_rotary_pos_emb(q, k, cos[:, :5], sin)),
        ("cos must have shape", lambda: torch.ops.ltx_kernels.apply_rotary_pos_emb(q, k, torch.randn(2, 6, 18, device=device), sin)),
        ("sin must have the shape of cos", lambda: ltx_kernels.apply_rotary_pos_emb(q, k, cos, sin[:, :, :8])),
        ("cos must have the dtype of q", lambda: ltx_kernels.apply_rotary_pos_emb(q, k, cos.double(), sin.double())),
        ("even last dim", lambda: ltx_kernels.apply_rotary_pos_emb(q, k, cos[..., :5], sin[..., :5])),
        ("sections must add up", lambda: ltx_kernels.apply_rotary_pos_emb(q, k, cos, sin, sections=[8, 4])),
        ("x must be \\[B, S, D\\]", lambda: ltx_kernels.ltx_rope_angles(x[0], 1, 2, 3)),
        ("x must have num_frames \\* height \\* width", lambda: ltx_kernels.ltx_rope_angles(x, 2, 2, 2)),
        ("video_coords must be \\[B, 3, S\\]", lambda: ltx_kernels.ltx_rope_angles(x, 1, 2, 3, video_coords=torch.randn(2, 3, 5, device=device))),
        ("k must have the shape of q", lambda: ltx_kernels.ltx_qk_norm_rope(x, x[:1], None, None, num_frames=1, height=2, width=3)),
        ("weight_q must have shape", lambda: ltx_kernels.ltx_qk_norm_rope(x, x, torch.randn(35, device=device), None, num_frames=1, height=2, width=3)),
        ("cos and sin must cover every channel", lambda: ltx_kernels.ltx_rope(x, cos, sin)),
        ("ltx_qk_norm_rope: unexpected keyword argument\\(s\\) base_depth, tehta; the positions take "
         "rope_interpolation_scale, video_coords, theta",
         lambda: ltx_kernels.ltx_qk_norm_rope(x, x, None, None, num_frames=1, height=2, width=3, tehta=1.0,
                                              base_depth=2)),
        ("ltx_qk_norm_rope: theta must be", lambda: ltx_kernels.ltx_qk_norm_rope(x, x, None, None, num_frames=1,
                                                                              height=2, width=3, theta=-1.0)),
    ]
    for message, call in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            call()


@pytest.mark.parametrize("device", DEVICES)
def test_a_core_rejection_names_the_op_on_every_device(device):
    """A row of 2^31 columns passes the binding's checks but not the core's (32-bit column
    indices): the core's own message reaches the user with the op's name, on the CPU and on
    CUDA alike (a CUDA launcher can only return an error code; it once surfaced as 'CUDA launch
    failed: invalid argument'). torch.empty does not touch the 4 GiB, and nothing is written."""
    x = torch.empty(1, 1, 2**31, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"^ltx_rope_angles: cols must be < 2\^31$"):
        torch.ops.ltx_kernels.ltx_rope_angles(x, [1, 1, 1], [1.0, 1.0, 1.0], None, 10000.0)

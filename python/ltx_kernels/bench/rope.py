"""Benchmark cases of the RoPE family: LTX-Video's RoPE and its attention q/k path, against
the code diffusers runs (transformer_ltx.py), and an LLM's apply_rotary_pos_emb against
transformers' (and Liger's)."""

from __future__ import annotations

import torch

import ltx_kernels
from ltx_kernels.bench.harness import Case, rel_err


def _diffusers_ltx():
    try:
        from diffusers.models.transformers import transformer_ltx
    except ImportError:
        return None
    return transformer_ltx


def _liger_rope():
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except ImportError:
        return None
    return LigerRopeFunction


def eager_llm_rope(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb (Llama), unsqueeze_dim=1."""
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


# LTX-Video at 512x768: latent grid (frames, 16, 24); pipelines pass this interpolation scale
# (vae temporal compression / frame rate 25, spatial compression 32, 32).
LTX_SCALE = (8 / 25, 32.0, 32.0)


def ltx_cases(shapes, dtype=torch.bfloat16, log=print) -> list[Case]:
    """shapes: (label, B * S, D) with B = 2 (CFG) and S = frames * 16 * 24."""
    ltx = _diffusers_ltx()
    if ltx is None:
        log("  (diffusers not installed: LTX RoPE cases skipped)")
        return []
    out = []
    for label, rows, d in shapes:
        b, s = 2, rows // 2
        grid = (s // (16 * 24), 16, 24)
        q = torch.randn(b, s, d, device="cuda", dtype=dtype)
        k = torch.randn(b, s, d, device="cuda", dtype=dtype)
        rope = ltx.LTXVideoRotaryPosEmbed(d)
        cos, sin = rope(q, *grid, rope_interpolation_scale=LTX_SCALE)
        norm_q = torch.nn.RMSNorm(d, eps=1e-5).to("cuda", dtype)
        norm_k = torch.nn.RMSNorm(d, eps=1e-5).to("cuda", dtype)
        apply = ltx.apply_rotary_emb
        compiled_apply = torch.compile(apply)

        def stock_qk(q, k, cos, sin):
            """LTXAttnProcessor: norm_q / norm_k, then apply_rotary_emb with the tables."""
            return apply(norm_q(q), (cos, sin)), apply(norm_k(k), (cos, sin))

        compiled_qk = torch.compile(stock_qk)
        size = q.numel() * q.element_size()
        kwargs = dict(num_frames=grid[0], height=grid[1], width=grid[2], rope_interpolation_scale=LTX_SCALE)
        fq = lambda q=q, c=cos, s_=sin: apply(q, (c, s_))  # noqa: E731
        # Given the tables (12 bytes per element: bf16 in and out, fp32 cos and sin).
        ours = lambda q=q, c=cos, s_=sin: ltx_kernels.ltx_rope(q, c, s_)  # noqa: E731
        out.append(Case("ltx rope (fp32 tables)", label, 6 * size,
                        {"ltx_kernels": ours, "eager": fq,
                         "compile": lambda q=q, c=cos, s_=sin: compiled_apply(q, (c, s_))},
                        lambda ours=ours, fq=fq: rel_err(ours(), fq())))
        # Angles in the kernel: what must move is q in and out (4 bytes per element); the
        # anchors still read diffusers' tables, which is how diffusers computes it.
        ours = lambda q=q, kw=kwargs: ltx_kernels.ltx_rope_angles(q, **kw)  # noqa: E731
        out.append(Case("ltx rope (angles in kernel)", label, 2 * size,
                        {"ltx_kernels": ours, "eager": fq,
                         "compile": lambda q=q, c=cos, s_=sin: compiled_apply(q, (c, s_))},
                        lambda ours=ours, fq=fq: rel_err(ours(), fq())))
        # The attention q/k path: norm_q + norm_k + RoPE of both, fused, angles in the kernel.
        ours = lambda q=q, k=k, kw=kwargs: ltx_kernels.ltx_qk_norm_rope(  # noqa: E731
            q, k, norm_q.weight, norm_k.weight, 1e-5, **kw)
        stock = lambda q=q, k=k, c=cos, s_=sin: stock_qk(q, k, c, s_)  # noqa: E731
        out.append(Case("ltx q+k norm + rope", label, 4 * size,
                        {"ltx_kernels": ours, "eager": stock,
                         "compile": lambda q=q, k=k, c=cos, s_=sin: compiled_qk(q, k, c, s_)},
                        lambda ours=ours, stock=stock: rel_err(ours()[0], stock()[0])))
    return out


def llm_cases(shapes, dtype=torch.bfloat16) -> list[Case]:
    """shapes: (label, tokens, D): Llama-3-8B attention (32 q heads, 8 kv heads, Dh 128)."""
    liger = _liger_rope()
    compiled = torch.compile(eager_llm_rope)
    out = []
    for label, tokens, d in shapes:
        dh, hq, hk = 128, d // 128, d // 512
        q = torch.randn(1, hq, tokens, dh, device="cuda", dtype=dtype)
        k = torch.randn(1, hk, tokens, dh, device="cuda", dtype=dtype)
        angles = torch.randn(1, tokens, dh // 2, device="cuda") * 100
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        moved = 2 * (q.numel() + k.numel()) * q.element_size() + 2 * cos.numel() * cos.element_size()
        impls = {
            "ltx_kernels": lambda q=q, k=k, c=cos, s=sin: ltx_kernels.apply_rotary_pos_emb(q, k, c, s),
            "eager": lambda q=q, k=k, c=cos, s=sin: eager_llm_rope(q, k, c, s),
            "compile": lambda q=q, k=k, c=cos, s=sin: compiled(q, k, c, s),
        }
        if liger:
            impls["liger"] = lambda q=q, k=k, c=cos, s=sin: liger.apply(q, k, c, s)
        out.append(Case("apply_rotary_pos_emb", f"{label.split()[0]} {tokens}x{hq}+{hk}x{dh}", moved, impls,
                        lambda q=q, k=k, c=cos, s=sin: rel_err(ltx_kernels.apply_rotary_pos_emb(q, k, c, s)[0],
                                                               eager_llm_rope(q, k, c, s)[0])))
    return out

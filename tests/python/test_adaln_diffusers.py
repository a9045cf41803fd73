"""The AdaLN ops against diffusers' own LTX-Video block code (transformer_ltx.py).

A tiny LTXVideoTransformerBlock supplies norm1, norm2 and scale_shift_table; each fused op is
compared with the exact expressions of LTXVideoTransformerBlock.forward, for per-batch
(text-to-video) and per-token (image-to-video, condition) timestep embeddings.
"""

import pytest
import torch

import ltx_kernels
from conftest import DEVICES, assert_close

transformer_ltx = pytest.importorskip("diffusers.models.transformers.transformer_ltx")


def ltx_block_inputs(device, per_token, dtype=torch.float32, b=2, s=12, d=64):
    torch.manual_seed(0)
    block = transformer_ltx.LTXVideoTransformerBlock(
        dim=d, num_attention_heads=2, attention_head_dim=d // 2, cross_attention_dim=d
    ).to(device=device, dtype=dtype)
    with torch.no_grad():
        block.scale_shift_table.normal_()
    x = torch.randn(b, s, d, device=device, dtype=dtype)
    temb = torch.randn(b, s if per_token else 1, 6 * d, device=device, dtype=dtype)
    # As the block computes them: strided views unbound from [B, T, 6, D].
    ada = block.scale_shift_table[None, None] + temb.reshape(b, temb.size(1), 6, -1)
    return block, x, ada.unbind(dim=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_token", [False, True])
@torch.no_grad()
def test_norm1_modulation_matches_diffusers(device, per_token):
    block, x, (shift_msa, scale_msa, *_) = ltx_block_inputs(device, per_token)
    expected = block.norm1(x) * (1 + scale_msa) + shift_msa
    got = ltx_kernels.adaln_rms_norm(x, scale_msa, shift_msa, block.norm1.weight, block.norm1.eps)
    assert_close(got, expected, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_token", [False, True])
@torch.no_grad()
def test_residuals_and_norm2_match_diffusers(device, per_token):
    block, x, (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp) = ltx_block_inputs(
        device, per_token)
    attn1, attn2, ff = (torch.randn_like(x) for _ in range(3))
    # hidden_states + attn * gate_msa, then + attn2, then norm2 with modulation.
    expected_x = x + attn1 * gate_msa
    x1, _ = ltx_kernels.gated_residual_adaln_rms_norm(x, attn1, gate_msa, scale_mlp, shift_mlp)
    assert_close(x1, expected_x, torch.float32)
    expected_x = expected_x + attn2
    expected_norm = block.norm2(expected_x) * (1 + scale_mlp) + shift_mlp
    x2, norm2 = ltx_kernels.gated_residual_adaln_rms_norm(
        x1, attn2, None, scale_mlp, shift_mlp, block.norm2.weight, block.norm2.eps)
    assert_close(x2, expected_x, torch.float32)
    assert_close(norm2, expected_norm, torch.float32)
    # hidden_states + ff_output * gate_mlp, fused with the next block's norm1.
    expected_x = expected_x + ff * gate_mlp
    expected_norm = block.norm1(expected_x) * (1 + scale_msa) + shift_msa
    x3, norm1 = ltx_kernels.gated_residual_adaln_rms_norm(
        x2, ff, gate_mlp, scale_msa, shift_msa, block.norm1.weight, block.norm1.eps)
    assert_close(x3, expected_x, torch.float32)
    assert_close(norm1, expected_norm, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@torch.no_grad()
def test_low_precision_no_worse_than_diffusers(device, dtype):
    """In bf16/fp16, ours is at least as close to the fp32 result as diffusers' own code."""
    block, x, (shift, scale, *_) = ltx_block_inputs(device, True, dtype=torch.float32, d=256)
    reference = block.norm1(x) * (1 + scale) + shift
    xl, scl, shl = x.to(dtype), scale.to(dtype), shift.to(dtype)
    stock = block.to(dtype).norm1(xl) * (1 + scl) + shl
    ours = ltx_kernels.adaln_rms_norm(xl, scl, shl, None, block.norm1.eps)
    err = lambda t: ((t.double() - reference.double()).norm() / reference.double().norm()).item()  # noqa: E731
    assert err(ours) <= err(stock) * 1.1

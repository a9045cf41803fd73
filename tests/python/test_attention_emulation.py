"""The P V format emulation behind the 8-bit attention's design (ltx_kernels.bench.attention_emulation):
it runs on the CPU and its errors order as the formats' precision does."""

import torch

from ltx_kernels.bench import attention_emulation as emu
from ltx_kernels.bench.attention import inputs


def test_bf16_p_v_is_the_scores_error_alone_and_8_bit_formats_add_to_it():
    q, k, v = inputs(1, 2, 64, 300, 64, outlier=False, seed=1, device="cpu")
    err = emu.errors(q, k, v)
    assert set(err) == set(emu.COMBOS) and all(0 < e < 0.2 for e in err.values())
    # The INT8 scores alone (16-bit P V) are at the 8-bit method's documented level.
    assert err[("bf16", "bf16")] < 2e-2
    for pair in emu.COMBOS[1:]:
        assert err[pair] > err[("bf16", "bf16")], pair
    assert err[("e4m3", "e4m3")] > max(err[("e4m3", "bf16")], err[("bf16", "e4m3")])
    # A running max that lags by up to 8 (log2 units) leaves uint8 P too coarse; e4m3 keeps
    # its relative precision at any scale.
    lazy = emu.errors(q, k, v, slack=8.0)
    assert lazy[("u8", "s8")] > 10 * err[("u8", "s8")]
    assert lazy[("e4m3", "e4m3")] < 1.2 * err[("e4m3", "e4m3")]
    assert lazy[("bf16", "bf16")] < 1.05 * err[("bf16", "bf16")]


def test_scores_smooth_k_and_approximate_the_exact_ones():
    """Up to a per-row constant (k's mean over the keys, which softmax ignores) the scores are
    q k^T / sqrt(D) within INT8 rounding, and a per-channel shift of k does not change them
    beyond the shifted inputs' own bf16 rounding."""
    q, k, _ = inputs(1, 1, 64, 128, 64, outlier=False, seed=2, device="cpu")
    exact = q.double() @ k.double().transpose(-1, -2) / 8.0
    s = emu.scores(q, k).double()
    centred = lambda t: t - t.mean(dim=-1, keepdim=True)  # noqa: E731
    assert (centred(s) - centred(exact)).norm() / exact.norm() < 2e-2
    shifted = (k.float() + 3.0 * torch.randn(1, 1, 1, 64, generator=torch.Generator().manual_seed(3))).bfloat16()
    assert torch.allclose(centred(emu.scores(q, shifted).double()), centred(s), atol=0.1)

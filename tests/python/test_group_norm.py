"""group_norm (a UNet's GroupNorm, GroupNorm + SiLU, and a ResNet block's time-embedding add +
norm2 + SiLU in one pass): against the fp64 formula on every device, dtype, layout (channels
first and last, strided views copied first), odd and small sizes; the CUDA kernels against
the CPU reference; its backward against autograd of the formula; bad arguments."""

import pytest
import torch
import torch.nn.functional as F

import ltx_kernels
from conftest import DEVICES, DTYPES, HAS_CUDA, assert_close
from test_backward import check_grads, leaf

ops = torch.ops.ltx_kernels

# (x shape, groups): a linear layer's [N, C], 1D / 2D / 3D maps, odd sizes, one group, one
# channel per group, a map wider than a channels-first segment (at least 1024 positions) and
# one longer than a channels-last segment (at least 64) with a partial last segment.
SHAPES = [
    ((3, 6), 3),
    ((2, 8, 13), 4),
    ((2, 12, 7, 5), 3),
    ((1, 4, 3, 3), 1),
    ((2, 5, 4, 6), 5),
    ((2, 4, 3, 5, 7), 2),
    ((1, 6, 65, 67), 3),
    ((2, 32, 17, 19), 8),
]


def formula(x, groups, weight=None, bias=None, eps=1e-5, add=None, silu=False):
    """The fp64 formula: torch's group_norm of x + add, then SiLU. (No element: an empty
    result whose gradients are zeros; torch's group_norm backward fails on empty inputs.)"""
    if x.numel() == 0:
        return x.double() * 0.0
    h = x.double()
    if add is not None:
        h = h + add.double().view(*add.shape, *([1] * (x.dim() - 2)))
    # (weight and bias applied here: torch's group_norm backward fails given a bias alone)
    y = F.group_norm(h, groups, None, None, eps)
    channel = (-1, *([1] * (x.dim() - 2)))
    if weight is not None:
        y = y * weight.double().view(channel)
    if bias is not None:
        y = y + bias.double().view(channel)
    return F.silu(y) if silu else y


def inputs(shape, dtype, device, seed, affine=True, with_add=False, params_dtype=None):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype).to(device)
    pd = params_dtype or dtype
    weight = (torch.randn(c, generator=g) + 1).to(pd).to(device) if affine else None
    bias = torch.randn(c, generator=g).to(pd).to(device) if affine else None
    add = torch.randn(shape[0], c, generator=g).to(dtype).to(device) if with_add else None
    return x, weight, bias, add


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", SHAPES)
@pytest.mark.parametrize("form", ["plain", "silu", "add_silu", "no_affine"])
def test_matches_formula(device, dtype, shape, groups, form):
    x, w, b, add = inputs(shape, dtype, device, seed=len(shape) * 7 + groups, affine=form != "no_affine",
                          with_add=form == "add_silu")
    silu = form in ("silu", "add_silu")
    out = ltx_kernels.group_norm(x, groups, w, b, 1e-5, add=add, activation="silu" if silu else None)
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert_close(out, formula(x, groups, w, b, 1e-5, add, silu), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", [((2, 12, 7, 5), 3), ((1, 40, 33, 31), 4), ((2, 16, 3, 4, 5), 4)])
def test_channels_last(device, dtype, shape, groups):
    """A channels-last x (NHWC memory: a UNet run with channels_last) is read as it is and the
    output keeps its layout; 16-bit channel counts of 40 run 8-channel vectors."""
    x, w, b, add = inputs(shape, dtype, device, seed=3, with_add=True)
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    xl = x.contiguous(memory_format=fmt)
    out = ltx_kernels.group_norm(xl, groups, w, b, add=add, activation="silu")
    assert out.is_contiguous(memory_format=fmt)
    assert_close(out, formula(x, groups, w, b, add=add, silu=True), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_other_layouts_are_copied(device, dtype):
    """Neither channels first nor last (a spatial slice, a transposed map) is copied first; a
    contiguous view at an odd element offset is read as it is: the formula's values."""
    x, w, b, _ = inputs((2, 8, 12, 9), dtype, device, seed=5)
    for view in (x[:, :, 1:-2], x.transpose(2, 3), x.flatten()[1 : 1 + 2 * 8 * 11 * 9].view(2, 8, 11, 9)):
        out = ltx_kernels.group_norm(view, 4, w, b)
        assert_close(out, formula(view, 4, w, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float32_params(device, dtype):
    """A 16-bit x with float32 weight and bias (a model keeping its norms in fp32)."""
    x, w, b, _ = inputs((2, 6, 9, 4), dtype, device, seed=6, params_dtype=torch.float32)
    out = ltx_kernels.group_norm(x, 2, w, b, activation="silu")
    assert out.dtype == dtype
    assert_close(out, formula(x, 2, w, b, silu=True), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_large_mean_small_spread(device, channels_last):
    """Groups of mean 1e3 and std 1e-2: a one-pass E[x^2] - mean^2 cancels entirely; the
    shifted partial sums and Chan's merge must match fp64 on the same fp32 input within the
    bf16 tolerance."""
    x = (1e3 + 1e-2 * torch.randn(2, 8, 70, 70, dtype=torch.float64)).float().to(device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    assert_close(ltx_kernels.group_norm(x, 4), formula(x, 4), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_nonfinite(device):
    """No positions or no samples: an empty output of x's shape; a NaN poisons its group only."""
    for shape in [(0, 4, 3, 3), (2, 4, 0, 3), (2, 4, 0)]:
        out = ltx_kernels.group_norm(torch.empty(shape, device=device), 2)
        assert out.shape == shape
    x = torch.randn(2, 4, 5, 5, device=device)
    x[1, 3, 2, 2] = float("nan")
    out = ltx_kernels.group_norm(x, 2)
    assert out[1, 2:].isnan().all() and out[1, :2].isfinite().all() and out[0].isfinite().all()


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups,channels_last", [
    ((2, 320, 64, 64), 32, False),  # SDXL's first level (half size): 10 channels per group
    ((2, 320, 64, 64), 32, True),
    ((2, 1280, 8, 8), 32, False),
    ((2, 1280, 8, 8), 32, True),
    ((1, 30, 101, 3), 5, False),    # spatial % 8 != 0: the scalar stats and apply
    ((1, 30, 101, 3), 5, True),     # channels % 8 != 0: scalar apply channels last
    ((3, 64, 4100), 16, False),     # row segments of 1024 positions, the last of 4
    ((1, 320, 97, 89), 32, True),   # hundreds of channels-last segments, the last one shorter
    ((1, 2560, 9, 7), 32, True),    # two chunks of channel vectors per position
    ((2, 15, 11, 13), 5, True),     # odd channels: one channel per thread
    ((1, 96, 3, 3), 4, True),       # fewer positions than one segment's minimum
])
def test_cuda_matches_cpu_reference(dtype, shape, groups, channels_last):
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(shape, generator=g) + 2).to(dtype)
    add = torch.randn(shape[:2], generator=g).to(dtype)
    w, b = torch.randn(shape[1], generator=g).to(dtype), torch.randn(shape[1], generator=g).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ref = ltx_kernels.group_norm(x, groups, w, b, add=add, activation="silu")
    out = ltx_kernels.group_norm(x.cuda(), groups, w.cuda(), b.cuda(), add=add.cuda(), activation="silu")
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    # (statistics in fp32 on the GPU, in double on the CPU: within one rounding of the output)
    assert_close(out.cpu(), ref.double(), dtype)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_cuda_misaligned_view():
    """A view whose data starts 2 bytes into a 16-byte line runs the scalar paths."""
    base = torch.randn(1 + 2 * 16 * 24, dtype=torch.bfloat16, device="cuda")
    x = base[1:].view(2, 16, 24)
    assert_close(ltx_kernels.group_norm(x, 4), formula(x, 4), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((2, 8, 3, 4), 2), ((1, 4, 7, 3), 4), ((3, 6), 2)])
@pytest.mark.parametrize("form", ["plain", "add_silu", "no_affine_silu"])
def test_backward(device, dtype, shape, groups, form):
    x, _ = leaf(shape, dtype, device)
    affine = not form.startswith("no_affine")
    w = leaf((shape[1],), dtype, device)[0] if affine else None
    b = leaf((shape[1],), dtype, device)[0] if affine else None
    add = leaf(shape[:2], dtype, device)[0] if form == "add_silu" else None
    silu = form != "plain"

    def ours(x, w, b, add):
        return ops.group_norm(x, groups, w, b, 1e-5, add, silu)

    def reference(x, w, b, add):
        return formula(x, groups, w, b, 1e-5, add, silu)

    if add is not None and shape[1] == groups:
        # One channel per group: add shifts its whole group, which the norm removes, so its
        # gradient is 0 exactly, and ours rounding noise: small next to x's gradient.
        grads = torch.autograd.grad(ours(x, w, b, add), [x, add], torch.randn(shape, device=device).to(dtype))
        assert grads[1].abs().max() <= 1e-2 * grads[0].abs().max()
        add = None
    check_grads(ours, reference, [x, w, b, add], [x, w, b, add], dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_channels_last_and_float32_params(device):
    x = torch.randn(2, 6, 5, 4, device=device).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    w = torch.randn(6, device=device, requires_grad=True)
    b = torch.randn(6, device=device, requires_grad=True)
    check_grads(lambda x, w, b: ops.group_norm(x, 3, w, b, 1e-5, None, True),
                lambda x, w, b: formula(x, 3, w, b, silu=True), [x, w, b], [x, w, b], torch.bfloat16)


def test_opcheck():
    """The schema, the fake (Meta) kernel and the autograd registration agree with the op."""
    x = torch.randn(2, 6, 5, 4, requires_grad=True)
    w, b = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)
    add = torch.randn(2, 6, requires_grad=True)
    torch.library.opcheck(ops.group_norm.default, (x, 3, w, b, 1e-5, add, True))
    xl = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    torch.library.opcheck(ops.group_norm.default, (xl, 3, w, b, 1e-5, None, False))
    # The backward op itself, channels last too: its Meta strides are the real ones.
    for xb in (x.detach(), xl.detach()):
        torch.library.opcheck(ops.group_norm_backward.default,
                              (torch.randn(2, 6, 5, 4), xb, 3, w.detach(), b.detach(), 1e-5, add.detach(), True))


def test_compile_fullgraph():
    x = torch.randn(2, 8, 6, 6)
    w, b = torch.randn(8), torch.randn(8)
    add = torch.randn(2, 8)
    fn = torch.compile(lambda x, w, b, a: ltx_kernels.group_norm(x, 4, w, b, add=a, activation="silu"),
                       fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(x, w, b, add), ltx_kernels.group_norm(x, 4, w, b, add=add, activation="silu"))


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_arguments(device):
    """Each bad argument raises naming the op and the argument."""
    x = torch.randn(2, 6, 4, 4, device=device)
    w = torch.randn(6, device=device)
    cases = [
        (lambda: ltx_kernels.group_norm(x, 4), ValueError, "num_groups"),
        (lambda: ltx_kernels.group_norm(x, 0), ValueError, "num_groups"),
        (lambda: ltx_kernels.group_norm(x, 2.0), TypeError, "num_groups"),
        (lambda: ltx_kernels.group_norm(x, 3, eps=-1.0), ValueError, "eps"),
        (lambda: ltx_kernels.group_norm(x, 3, activation="gelu"), ValueError, "activation"),
        (lambda: ltx_kernels.group_norm(x[0, 0, 0], 1), ValueError, "x"),
        (lambda: ltx_kernels.group_norm(x.double(), 3), TypeError, "x"),
        (lambda: ltx_kernels.group_norm(x.int(), 3), TypeError, "x"),
        (lambda: ltx_kernels.group_norm(x, 3, torch.randn(5, device=device)), ValueError, "weight"),
        (lambda: ltx_kernels.group_norm(x, 3, w.half()), TypeError, "weight"),
        (lambda: ltx_kernels.group_norm(x, 3, None, torch.randn(6, 1, device=device)), ValueError, "bias"),
        (lambda: ltx_kernels.group_norm(x.half(), 3, w, w.half()), TypeError, "one dtype"),
        (lambda: ltx_kernels.group_norm(x, 3, add=torch.randn(2, 5, device=device)), ValueError, "add"),
        (lambda: ltx_kernels.group_norm(x, 3, add=torch.randn(6, device=device)), ValueError, "add"),
        (lambda: ltx_kernels.group_norm(x, 3, add=torch.randn(2, 6, device=device).half()), TypeError, "add"),
        (lambda: ops.group_norm_backward(torch.randn(2, 6, 4, device=device), x, 3), ValueError, "grad_out"),
    ]
    if device == "cpu":
        cases.append((lambda: ltx_kernels.group_norm(x, 3, w.to("meta")), ValueError, "weight"))
    for call, error, word in cases:
        with pytest.raises(error, match=word) as info:
            call()
        assert "group_norm" in str(info.value), str(info.value)

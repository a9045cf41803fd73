"""fused_linear_cross_entropy against the PyTorch formula in fp64 (loss and gradients), stock
16-bit numerics, chunking, ignore_index, layouts, bad input, opcheck and torch.compile."""

import pytest
import torch
import torch.nn.functional as F

import ltx_kernels
from conftest import DEVICES, DTYPES, RoundedGradient, assert_close
from test_backward import check_grads

ops = torch.ops.ltx_kernels


def formula(x, weight, target, bias=None, ignore_index=-100, reduction="mean", logit_grad_dtype=None):
    """torch's cross-entropy of x @ weight.T + bias; with logit_grad_dtype, its backward rounds
    d loss / d logits to that dtype before the x and weight gradients (not the bias's)."""
    logits = F.linear(x, weight)
    if logit_grad_dtype is not None:
        logits = RoundedGradient.apply(logits, logit_grad_dtype)
    if bias is not None:
        logits = logits + bias
    return F.cross_entropy(logits.reshape(-1, weight.shape[0]), target.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction).reshape(target.shape if reduction == "none" else ())


def make(rows, hidden, vocab, dtype, device, ignored=0.25, bias=True, lead=()):
    x = torch.randn(*lead, rows, hidden, dtype=dtype, device=device)
    weight = (torch.randn(vocab, hidden, device=device) / hidden**0.5).to(dtype)
    b = torch.randn(vocab, dtype=dtype, device=device) if bias else None
    target = torch.randint(0, vocab, (*lead, rows), device=device)
    keep = torch.rand(target.shape, device=device) >= ignored
    if ignored < 1.0 and target.numel():
        keep.view(-1)[0] = True  # at least one target counts (a mean over none is NaN)
    return x, weight, target.where(keep, -100), b


# (rows, hidden, vocab): one class, odd sizes, several chunks of classes (a chunk holds 128
# classes at these hidden sizes: 8 chunks, the last of 104; 3, the last of one class) and one.
SHAPES = [(1, 8, 1), (7, 3, 5), (67, 16, 1000), (130, 64, 257), (33, 96, 40)]


def each_case(test):
    """``test`` over every device, dtype, shape and reduction."""
    for name, values in [("reduction", ["mean", "sum", "none"]), ("shape", SHAPES), ("dtype", DTYPES),
                         ("device", DEVICES)]:
        test = pytest.mark.parametrize(name, values)(test)
    return test


@each_case
def test_matches_the_formula(device, dtype, shape, reduction):
    x, weight, target, bias = make(*shape, dtype, device)
    got = ltx_kernels.fused_linear_cross_entropy(x, weight, target, bias, reduction=reduction)
    want = formula(x.double(), weight.double(), target, bias.double(), reduction=reduction)
    assert got.dtype == torch.float32 and got.shape == want.shape
    # fp32 logits from the rounded inputs: the loss is fp32-accurate whatever x's dtype
    assert_close(got, want, torch.float32, scale=10.0)


@each_case
def test_gradients_match_the_formula(device, dtype, shape, reduction):
    x, weight, target, bias = make(*shape, dtype, device)
    leaves = [t.requires_grad_() for t in (x, weight, bias)]
    # Times the vocabulary: a weight row's gradient is ~1 / vocab of x, which fp16 would hold
    # as a subnormal (the same in stock fp16 training, where a loss scale is used). The
    # reference rounds d loss / d logits to x's dtype as the op does: a weight gradient element
    # sums a chunk's rows, and a target's entry (p - 1) * k rounded to bf16 is off by up to ~2,
    # more than the table allows an element that such terms cancel to (1 run in ~150 failed).
    k = shape[2]
    check_grads(lambda x, w, b: k * ltx_kernels.fused_linear_cross_entropy(x, w, target, b, reduction=reduction),
                lambda x, w, b: k * formula(x, w, target, b, reduction=reduction, logit_grad_dtype=dtype),
                leaves, leaves, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_targets_at_every_chunk_edge(device):
    """Targets on both sides of each boundary between chunks of classes (128 classes a chunk at
    hidden 16; the last chunk 104 wide) and at the vocabulary's ends: each row's picked logit,
    loss and the one-hot part of its gradient come from the right chunk."""
    classes = [0, 1, 126, 127, 128, 129, 255, 256, 767, 768, 895, 896, 998, 999]
    x, weight, _, bias = make(len(classes), 16, 1000, torch.float32, device)
    target = torch.tensor(classes, device=device)
    got = ltx_kernels.fused_linear_cross_entropy(x, weight, target, bias, reduction="none")
    assert_close(got, formula(x.double(), weight.double(), target, bias.double(), reduction="none"),
                 torch.float32, scale=10.0)
    leaves = [t.requires_grad_() for t in (x, weight, bias)]
    check_grads(lambda x, w, b: ltx_kernels.fused_linear_cross_entropy(x, w, target, b, reduction="sum"),
                lambda x, w, b: formula(x, w, target, b, reduction="sum"), leaves, leaves, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_sum_exp_and_its_gradient(device, dtype):
    """return_lse: each token's log-sum-exp of the logits (ignored tokens too), differentiable:
    a z-loss on it trains x, weight and bias as torch's formula does."""
    x, weight, target, bias = make(67, 16, 1000, dtype, device)
    loss, lse = ltx_kernels.fused_linear_cross_entropy(x, weight, target, bias, return_lse=True)
    logits = (x.double() @ weight.double().T + bias.double())
    assert lse.dtype == torch.float32 and lse.shape == target.shape
    assert_close(lse, torch.logsumexp(logits, -1), torch.float32, scale=10.0)

    def z_loss(head):
        def f(x, w, b):
            loss, lse = head(x, w, b)
            return 1000 * (loss + 1e-2 * lse.square().mean())
        return f

    def ours(x, w, b):
        return ltx_kernels.fused_linear_cross_entropy(x, w, target, b, return_lse=True)

    def stock(x, w, b):
        logits = RoundedGradient.apply(F.linear(x, w), dtype) + b
        return F.cross_entropy(logits, target, ignore_index=-100), torch.logsumexp(logits, -1)

    leaves = [t.requires_grad_() for t in (x, weight, bias)]
    check_grads(z_loss(ours), z_loss(stock), leaves, leaves, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_no_bias_3d_strided_input_and_own_ignore_index(device):
    wide = torch.randn(2, 9, 40, device=device)
    x = wide[..., 4:36]  # rows strided, leading dims kept
    weight = torch.randn(300, 32, device=device, requires_grad=True)
    target = torch.randint(0, 300, (2, 9), device=device)
    target[0, :3] = 7
    x.requires_grad_()
    check_grads(lambda x, w: ltx_kernels.fused_linear_cross_entropy(x, w, target, ignore_index=7),
                lambda x, w: formula(x, w, target, ignore_index=7), [x, weight], [x, weight], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_no_worse_than_stock(device):
    """Stock transformers rounds the logits to bf16 before its fp32 cross-entropy; ours does
    not: the loss and gradients are at least as close to fp64."""
    x, weight, target, bias = make(256, 64, 2000, torch.bfloat16, device, bias=False)
    ref = formula(x.double(), weight.double(), target)
    ours = ltx_kernels.fused_linear_cross_entropy(x, weight, target)
    stock = F.cross_entropy(F.linear(x, weight).float(), target)
    assert abs(ours.double() - ref).item() <= abs(stock.double() - ref).item() + 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_every_target_ignored(device):
    x, weight, target, bias = make(5, 8, 11, torch.float32, device, ignored=1.0)
    x.requires_grad_()
    assert ltx_kernels.fused_linear_cross_entropy(x, weight, target).isnan().item()  # 0 / 0, as torch
    total = ltx_kernels.fused_linear_cross_entropy(x, weight, target, reduction="sum")
    assert total.item() == 0.0
    (gx,) = torch.autograd.grad(total, x)
    assert torch.equal(gx, torch.zeros_like(gx))


@pytest.mark.parametrize("device", DEVICES)
def test_no_tokens(device):
    x = torch.randn(0, 8, device=device)
    weight = torch.randn(11, 8, device=device)
    target = torch.empty(0, dtype=torch.long, device=device)
    assert ltx_kernels.fused_linear_cross_entropy(x, weight, target, reduction="sum").item() == 0.0
    assert ltx_kernels.fused_linear_cross_entropy(x, weight, target, reduction="none").shape == (0,)
    # hidden 0: every logit is the bias (here none: 0), the loss log(vocab)
    loss = ltx_kernels.fused_linear_cross_entropy(torch.randn(3, 0, device=device), torch.randn(11, 0, device=device),
                                                  torch.tensor([0, 4, 10], device=device))
    assert loss.item() == pytest.approx(torch.log(torch.tensor(11.0)).item(), rel=1e-6)


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda a: {**a, "target": a["target"].int()}, TypeError, "target must be int64"),
        (lambda a: {**a, "target": a["target"][:3]}, ValueError, "target must have x's shape"),
        (lambda a: {**a, "weight": a["weight"][:, :5]}, ValueError, r"weight must be \[vocab, hidden\]"),
        (lambda a: {**a, "weight": a["weight"].double()}, TypeError, "weight must have x's dtype"),
        (lambda a: {**a, "bias": a["bias"][:4]}, ValueError, r"bias must be \[vocab\]"),
        (lambda a: {**a, "target": a["target"].clone().fill_(11)}, ValueError, r"outside \[0, 11\)"),
        (lambda a: {**a, "target": a["target"].clone().fill_(-1)}, ValueError, "outside"),
        (lambda a: {**a, "reduction": "avg"}, ValueError, "reduction must be"),
        (lambda a: {**a, "ignore_index": 1.5}, TypeError, "ignore_index must be an int"),
        (lambda a: {**a, "x": a["x"].double(), "weight": a["weight"].double()}, TypeError, "x must be float32"),
    ],
)
def test_bad_input_names_the_op_and_argument(change, error, message):
    x, weight, target, bias = make(6, 8, 11, torch.float32, "cpu", ignored=0.0)
    args = change({"x": x, "weight": weight, "target": target, "bias": bias})
    with pytest.raises(error, match=f"fused_linear_cross_entropy: .*{message}|fused_linear_cross_entropy: {message}"):
        ltx_kernels.fused_linear_cross_entropy(**args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile_forward_backward(device):
    x, weight, target, bias = make(20, 16, 70, torch.float32, device)
    torch.library.opcheck(ops.fused_linear_cross_entropy.default, (x, weight, target, bias, -100, "mean"))
    torch.library.opcheck(ops.fused_linear_cross_entropy.default, (x, weight, target, None, -100, "none"))

    def head(x, weight, bias):
        return ltx_kernels.fused_linear_cross_entropy(x * 2, weight, target, bias)

    eager = [t.clone().requires_grad_() for t in (x, weight, bias)]
    compiled = [t.clone().requires_grad_() for t in (x, weight, bias)]
    torch._dynamo.reset()
    loss = torch.compile(head, backend="aot_eager", fullgraph=True)(*compiled)
    assert_close(loss, head(*eager), torch.float32)
    for g, w in zip(torch.autograd.grad(loss, compiled), torch.autograd.grad(head(*eager), eager)):
        assert_close(g, w, torch.float32)


@pytest.mark.parametrize("op", ["fused_linear_cross_entropy", "linear_gelu_tanh"])
def test_autocast_runs_the_gemm_ops_in_its_dtype(op):
    """Under torch.autocast (bf16, CPU here; the CUDA kernel is the same code) the GEMM ops cast
    their floating inputs as torch's linear does, so fp32 master weights run a bf16 GEMM: the
    result equals the call on bf16 copies, and the gradients reach the fp32 leaves in fp32."""
    x = torch.randn(9, 16, requires_grad=True)
    weight = torch.randn(300, 16, requires_grad=True)
    bias = torch.randn(300, requires_grad=True)
    if op == "fused_linear_cross_entropy":
        target = torch.randint(0, 300, (9,))
        call = lambda x, w, b: ltx_kernels.fused_linear_cross_entropy(x, w, target, b)  # noqa: E731
    else:
        call = lambda x, w, b: ltx_kernels.linear_gelu_tanh(x, w, b).float().square().mean()  # noqa: E731
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = call(x, weight, bias)
    want = call(*(t.detach().bfloat16() for t in (x, weight, bias)))
    assert torch.equal(got, want)
    got.backward()
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in (x, weight, bias))

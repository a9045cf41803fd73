"""Ops without a backward (the FP8 path, attention, RoPE, the in-place and out= forms, the
backward ops themselves): an input that requires grad in grad mode must raise a clear error
naming the op and the argument, never give silent None gradients. Ops with one are tested in
test_backward.py."""

import pytest
import torch

from conftest import DEVICES

NAMESPACE = "ltx_kernels"


def all_overloads():
    """Every registered overload of the namespace, e.g. ``geglu.out``."""
    prefix = f"{NAMESPACE}::"
    packets = {n[len(prefix):].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)}
    return sorted(
        f"{name}.{overload}" for name in packets for overload in getattr(torch.ops.ltx_kernels, name).overloads()
    )


def overload(name: str) -> torch._ops.OpOverload:
    packet, overload_name = name.split(".")
    return getattr(getattr(torch.ops.ltx_kernels, packet), overload_name)


def arguments(op: torch._ops.OpOverload, device: str, grad_index: int) -> tuple[list, dict]:
    """Arguments of the schema's types (values need not be valid for the kernel: the grad
    check comes first); the `grad_index`-th tensor requires grad."""
    placeholders = {
        "float": 1e-6, "Optional[float]": None, "int": 1, "bool": False, "str": "tanh", "Optional[List[int]]": None,
        "Optional[int]": None,  # ScalarType?
        "List[int]": [1, 1, 1], "List[float]": [1.0, 1.0, 1.0],
    }
    args, kwargs, tensor_index = [], {}, 0
    for arg in op._schema.arguments:
        kind = str(arg.type)
        if kind in ("Tensor", "Optional[Tensor]"):
            value = torch.randn(4, 8, device=device).requires_grad_(tensor_index == grad_index)
            tensor_index += 1
        else:
            assert kind in placeholders, f"{op}: argument type {kind} not covered by this test"
            value = placeholders[kind]
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return args, kwargs


def has_backward(name: str) -> bool:
    packet, overload_name = name.split(".")
    return overload_name == "default" and hasattr(torch.ops.ltx_kernels, f"{packet}_backward")


FORWARD_ONLY = [name for name in all_overloads() if not has_backward(name)]


def tensor_arguments(op: torch._ops.OpOverload) -> list[str]:
    return [a.name for a in op._schema.arguments if str(a.type) in ("Tensor", "Optional[Tensor]")]


def test_every_op_is_covered():
    names = all_overloads()
    assert "rms_norm.default" in names and "geglu.out" in names and len(names) >= 20
    assert "fp8_linear.default" in FORWARD_ONLY and "rms_norm_backward.default" in FORWARD_ONLY
    assert "rms_norm.default" not in FORWARD_ONLY


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORWARD_ONLY)
def test_requires_grad_raises_naming_op_and_argument(device, name):
    op = overload(name)
    for index, arg_name in enumerate(tensor_arguments(op)):
        with pytest.raises(RuntimeError, match=rf"{NAMESPACE}::{op._schema.name.split('::')[1]}.*`{arg_name}` requires grad.*no backward"):
            args, kwargs = arguments(op, device, index)
            op(*args, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", all_overloads())
def test_no_grad_mode_does_not_raise_the_grad_error(device, name):
    """Under no_grad (what pipelines use) the grad check is off; whatever the kernel then says
    about these placeholder arguments, it is not the grad error."""
    op = overload(name)
    with torch.no_grad():
        try:
            args, kwargs = arguments(op, device, 0)
            op(*args, **kwargs)
        except (RuntimeError, ValueError, TypeError) as error:
            assert "requires grad" not in str(error)


@pytest.mark.parametrize("device", DEVICES)
def test_valid_call_without_grad_runs(device):
    x = torch.randn(3, 16, device=device)
    w = torch.randn(16, device=device)
    out = torch.ops.ltx_kernels.rms_norm(x, w, 1e-6, 0.0)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(out, ref)
    assert not out.requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_and_out_bump_the_version_counter(device):
    """Written arguments get their version bumped, as torch's own in-place ops do."""
    x, residual = torch.randn(3, 16, device=device), torch.randn(3, 16, device=device)
    before = residual._version
    torch.ops.ltx_kernels.fused_add_rms_norm_(x, residual, None, 1e-6, 0.0)
    assert residual._version == before + 1
    out = torch.empty(3, 8, device=device)
    before = out._version
    torch.ops.ltx_kernels.swiglu.out(torch.randn(3, 16, device=device), out=out)
    assert out._version == before + 1


def test_compile_with_grad_raises():
    """What torch.compile traces goes through the same check."""
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.ops.ltx_kernels.quantize_fp8(x, "none"), backend="aot_eager")
    with pytest.raises(Exception, match="requires grad"):
        f(torch.randn(3, 16, requires_grad=True))

"""HF Kernels Hub route: build.toml in sync with the sources, `export-hub` output loaded by the
real `kernels` package (get_local_kernel, kernelize with LocalLayerRepository, compile mode)."""

import ast
import json
import re
from pathlib import Path

import pytest
import torch

import ltx_kernels
from conftest import HAS_CUDA, assert_close
from ltx_kernels import hub

kernels = pytest.importorskip("kernels")
transformers = pytest.importorskip("transformers")
from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEVICE = "cuda" if HAS_CUDA else "cpu"
# Where the extension's sources live (CMakeLists.txt globs these).
SOURCE_GLOBS = ["include/ltx_kernels/*", "src/core/*", "src/ops/*", "src/reference/*", "src/torch/*"]


def listed_sources(build: dict) -> set[str]:
    sections = [build["torch"], *build["kernel"].values()]
    return {path for section in sections for path in section["src"]}


def test_build_toml_lists_every_source_and_nothing_else():
    build = hub.read_build_toml(REPO)
    on_disk = {str(p.relative_to(REPO)) for pattern in SOURCE_GLOBS for p in REPO.glob(pattern) if p.is_file()}
    listed = listed_sources(build)
    assert not on_disk - listed, f"sources missing from build.toml: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"build.toml lists files that do not exist: {sorted(listed - on_disk)}"
    # Each backend's kernel section carries every .cu (CUDA) and every host .cpp.
    by_backend = {k["backend"]: set(k["src"]) for k in build["kernel"].values()}
    host = {p for p in on_disk if p.startswith(("src/ops/", "src/reference/")) and p.endswith(".cpp")}
    assert host <= by_backend["cpu"] and host <= by_backend["cuda"]
    assert {p for p in on_disk if p.endswith(".cu")} <= by_backend["cuda"]


def test_build_toml_general_section():
    build = hub.read_build_toml(REPO)
    general = build["general"]
    assert re.fullmatch(r"[a-z][-a-z0-9]*[a-z0-9]", general["name"])
    assert isinstance(general["version"], int) and general["license"] == "Apache-2.0"
    assert sorted(general["backends"]) == ["cpu", "cuda"]
    assert sorted(k["backend"] for k in build["kernel"].values()) == ["cpu", "cuda"]
    cuda = next(k for k in build["kernel"].values() if k["backend"] == "cuda")
    assert "9.0a" in cuda["cuda-capabilities"] and all("torch" in k["depends"] for k in build["kernel"].values())
    # The Hopper attention kernel's CuTe headers, and the define that enables it.
    assert any(d.startswith("cutlass_") for d in cuda["depends"]) and "-DLTX_KERNELS_SM90A" in cuda["cuda-flags"]


def test_variant_files_import_only_each_other():
    """A variant module that imports a package module the variant does not carry fails only
    when the Hub loads it (the export tests below, minutes of build): caught here from the
    sources. Relative imports only: `ltx_kernels.x` absolute imports would leave the variant."""
    carried = {Path(name).stem for name in hub.VARIANT_FILES} | {"_C"}
    for name in hub.VARIANT_FILES:
        tree = ast.parse((hub.PACKAGE / name).read_text(), filename=name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1 and (node.level == 1 or not (node.module or "").startswith("ltx_kernels")), (
                    f"{name}:{node.lineno}: imports {node.module!r} by an absolute or parent path, outside the variant")
                if node.level == 1:
                    modules = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                    missing = [m for m in modules if m not in carried]
                    assert not missing, f"{name}:{node.lineno}: imports {missing}, which the Hub variant does not carry"
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("ltx_kernels") for a in node.names), (
                    f"{name}:{node.lineno}: imports the ltx_kernels package, outside the variant")


def test_export_needs_a_source_checkout(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an ltx-kernels checkout"):
        hub.export(tmp_path / "out", source=tmp_path)
    with pytest.raises(ValueError, match="backend must be 'cuda' or 'cpu'"):
        hub.variant_name("rocm")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """One export per test session: a CUDA variant for this GPU, or a CPU variant."""
    out = tmp_path_factory.mktemp("hub")
    if HAS_CUDA:
        major, minor = torch.cuda.get_device_capability()
        hub.export(out, REPO, "cuda", archs=[f"{major}.{minor}" + ("a" if major == 9 else "")])
    else:
        hub.export(out, REPO, "cpu")
    return out


def variant_dir(out: Path) -> Path:
    (variant,) = (out / "build").iterdir()
    return variant


def load(out: Path):
    """The exported kernel, through kernels' own resolution. A CPU variant under a CUDA build
    of torch is not what kernels would pick, so it is loaded by its variant path."""
    if HAS_CUDA or torch.version.cuda is None:
        return kernels.get_local_kernel(out)
    return kernels.get_local_kernel(variant_dir(out), backend="cpu")


def test_variant_layout_and_metadata(exported):
    variant = variant_dir(exported)
    assert re.fullmatch(r"torch\d{3,}-cxx11-(cu\d{3}|cpu)-x86_64-linux|torch\d{3,}-cxx11-(cu\d{3}|cpu)-aarch64-linux", variant.name)
    assert variant.name == hub.variant_name("cuda" if HAS_CUDA else "cpu")
    assert {p.name for p in variant.iterdir()} == {*hub.VARIANT_FILES, "_C.so", "metadata.json"}
    metadata = json.loads((variant / "metadata.json").read_text())
    assert metadata["name"] == "ltx-kernels" and metadata["version"] == 1 and metadata["license"] == "Apache-2.0"
    assert re.fullmatch(r"_ltx_kernels_[0-9a-f]{12}", metadata["id"])
    assert metadata["backend"]["type"] == ("cuda" if HAS_CUDA else "cpu")


def test_get_local_kernel_runs_our_ops_under_its_own_namespace(exported):
    kernel = load(exported)
    namespace = kernel._ops.NAMESPACE
    assert namespace != "ltx_kernels" and kernel.__name__ == namespace
    assert hasattr(getattr(torch.ops, namespace), "rms_norm")
    x = torch.randn(5, 3, 1000, device=DEVICE, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(1000, device=DEVICE, dtype=torch.bfloat16)
    assert torch.equal(kernel.rms_norm(x, w, 1e-6), ltx_kernels.rms_norm(x, w, 1e-6))
    for a, b in zip(kernel.fused_add_rms_norm(x, r, w), ltx_kernels.fused_add_rms_norm(x, r, w)):
        assert torch.equal(a, b)
    assert torch.equal(kernel.silu_and_mul(x, r), ltx_kernels.silu_and_mul(x, r))
    scale, shift = torch.randn(2, 5, 1, 1000, device=DEVICE, dtype=torch.bfloat16)
    assert torch.equal(kernel.adaln_rms_norm(x, scale, shift), ltx_kernels.adaln_rms_norm(x, scale, shift))
    q = torch.randn(2, 4, 7, 64, device=DEVICE)
    k = torch.randn(2, 2, 7, 64, device=DEVICE)
    cos, sin = torch.randn(2, 2, 7, 64, device=DEVICE)
    for a, b in zip(kernel.apply_rotary_pos_emb(q, k, cos, sin), ltx_kernels.apply_rotary_pos_emb(q, k, cos, sin)):
        assert torch.equal(a, b)
    assert {"RMSNorm", "GemmaRMSNorm", "SiluAndMul", "GeluTanh"} <= set(dir(kernel.layers))


def tiny_llama(dtype=torch.float32):
    # gelu_pytorch_tanh: the MLP activation is transformers' GELUTanh, a kernel layer ("GeluTanh").
    config = AutoConfig.for_model(
        "llama", vocab_size=151, hidden_size=96, intermediate_size=136, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, hidden_act="gelu_pytorch_tanh",
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 1.0 if "norm" in name else 0.1)
    return model.to(device=DEVICE, dtype=dtype)


def kernelized(model, repo: Path, mode):
    mapping = {name: {DEVICE: LocalLayerRepository(repo_path=repo, layer_name=name)} for name in ("RMSNorm", "GeluTanh")}
    with use_kernel_mapping(mapping):
        return kernelize(model, mode=mode, device=DEVICE)


def repo_path(out: Path) -> Path:
    return out if HAS_CUDA or torch.version.cuda is None else variant_dir(out)


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def test_kernelize_swaps_rmsnorm_and_activation(exported):
    ids = torch.randint(0, 151, (2, 13), device=DEVICE)
    model = tiny_llama()
    reference = logits(model, ids)
    stock_bf16 = logits(tiny_llama(torch.bfloat16), ids)
    for dtype in (torch.float32, torch.bfloat16):
        model = kernelized(tiny_llama(dtype), repo_path(exported), Mode.INFERENCE)
        norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
        acts = [m for m in model.modules() if type(m).__name__ == "GELUTanh"]
        assert norms and acts
        for m in norms + acts:
            assert type(m.forward.__func__).__name__ == "function"
            # the layer's forward: the norms' is the integrations' own (_forwards)
            assert m.forward.__func__.__module__.endswith((".layers", "._forwards")), m.forward.__func__.__module__
        out = logits(model, ids)
        err = ((out - reference).norm() / reference.norm()).item()
        if dtype == torch.float32:
            assert err < 1e-5
        else:
            assert err <= 1.1 * ((stock_bf16 - reference).norm() / reference.norm()).item()


def test_kernelize_in_compile_mode(exported):
    ids = torch.randint(0, 151, (2, 13), device=DEVICE)
    model = kernelized(tiny_llama(), repo_path(exported), Mode.INFERENCE | Mode.TORCH_COMPILE)
    eager = logits(model, ids)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if HAS_CUDA else "aot_eager")
    assert_close(logits(compiled, ids), eager, torch.float32)

"""HuggingFace Kernels Hub export: ``ltx-kernels export-hub OUTDIR``.

Builds the extension from a source checkout with a build-unique torch.ops namespace and lays
it out as a kernel repository the ``kernels`` package loads::

    OUTDIR/build/torch<MM>-cxx11-<cu<XYZ>|cpu>-<arch>-<os>/
        metadata.json     name, id (= the namespace), version, license, backend
        __init__.py       this package's API (ops, layers) ...
        _ops.py           ... bound to torch.ops.<namespace>
        ops.py _compile_formulas.py layers.py _forwards.py _patching.py _fp8.py _C.so

so ``kernels.get_local_kernel(OUTDIR)`` returns a module whose functions run our ops and
``LocalLayerRepository(repo_path=OUTDIR, layer_name="RMSNorm")`` maps layers for
``kernelize``. Uploading (``kernels upload``) is left to the user. The sources that go into a
build are listed in ``build.toml`` (kernel-builder's format) at the repository root.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import torch

from ltx_kernels import ops

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PACKAGE = Path(__file__).parent
# The package's files a kernel variant carries: the API without the integrations (the layers'
# forwards are the integrations' own, _forwards.py, with the patch mechanics they use).
VARIANT_FILES = ("__init__.py", "_ops.py", "ops.py", "_compile_formulas.py", "layers.py", "_forwards.py", "_patching.py",
                 "_fp8.py")
NAMESPACE_LINE = 'NAMESPACE = "ltx_kernels"'
BACKENDS = ("cuda", "cpu")


def variant_name(backend: str) -> str:
    """``torch211-cxx11-cu130-x86_64-linux`` for the running torch (``cpu`` for a CPU build)."""
    backend = ops._choice("variant_name", "backend", backend, BACKENDS)
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    if backend == "cuda":
        if torch.version.cuda is None:
            raise RuntimeError("backend 'cuda' needs a CUDA build of torch; this one is CPU only: "
                               "export the CPU variant instead (backend='cpu', --backend cpu)")
        compute = "cu" + torch.version.cuda.replace(".", "")
    else:
        compute = "cpu"
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    return f"torch{major}{minor}-{abi}-{compute}-{platform.machine()}-{sys.platform}"


def read_build_toml(source: Path) -> dict:
    path = source / "build.toml"
    if not path.is_file():
        raise FileNotFoundError(
            f"source={source} is not an ltx-kernels checkout (no build.toml); "
            "export-hub builds from the repository's sources"
        )
    with open(path, "rb") as f:
        return tomllib.load(f)


def _cuda_archs(build: dict) -> list[str]:
    kernels = [k for k in build.get("kernel", {}).values() if k.get("backend") == "cuda"]
    return sorted({arch for k in kernels for arch in k.get("cuda-capabilities", [])})


def _tool(name: str) -> str:
    """``name`` on PATH or next to this Python (a venv's pip-installed cmake / ninja)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError(f"export-hub needs `{name}` (pip install cmake ninja)")
    return found


def _compile(source: Path, build_dir: Path, namespace: str, backend: str, archs: list[str]) -> Path:
    cmake = _tool("cmake")
    configure = [
        cmake, "-S", str(source), "-B", str(build_dir), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
        "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
        f"-DLTX_KERNELS_OPS_NAMESPACE={namespace}",
        f"-DLTX_KERNELS_CUDA={'ON' if backend == 'cuda' else 'OFF'}",
    ]  # fmt: skip
    if backend == "cuda":
        configure.append("-DLTX_KERNELS_CUDA_ARCHITECTURES=" + ";".join(a.replace(".", "") for a in archs))
    for command in (configure, [cmake, "--build", str(build_dir), "--target", "_C"]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return build_dir / "_C.so"


def export(
    outdir: str | Path, source: str | Path = ".", backend: str | None = None, archs: list[str] | None = None
) -> Path:
    """Builds and lays out one kernel variant under ``outdir/build``; returns its directory.

    ``backend``: ``"cuda"`` (default when torch has CUDA) or ``"cpu"``. ``archs``: CUDA
    capabilities such as ``["9.0a"]``, by default those of ``source/build.toml`` (which also
    gives name, version and license).
    """
    for name, path in (("outdir", outdir), ("source", source)):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"export: {name} must be a path (str or os.PathLike), got {type(path).__name__}")
    if backend is not None:
        ops._choice("export", "backend", backend, BACKENDS)
    if archs is not None:
        archs = list(ops._strings("export", "archs", archs))
    source = Path(source).resolve()
    build = read_build_toml(source)
    backend = backend or ("cuda" if torch.version.cuda else "cpu")
    variant = Path(outdir) / "build" / variant_name(backend)
    namespace = f"_ltx_kernels_{uuid.uuid4().hex[:12]}"  # unique per build
    archs = (archs or _cuda_archs(build)) if backend == "cuda" else []
    with tempfile.TemporaryDirectory(prefix="ltx-kernels-hub-") as tmp:
        library = _compile(source, Path(tmp), namespace, backend, archs)
        if variant.exists():
            shutil.rmtree(variant)
        variant.mkdir(parents=True)
        shutil.copy2(library, variant / "_C.so")
    for name in VARIANT_FILES:
        shutil.copy2(PACKAGE / name, variant / name)
    ops_file = variant / "_ops.py"
    text = ops_file.read_text()
    if text.count(NAMESPACE_LINE) != 1:
        raise RuntimeError(f"{PACKAGE / '_ops.py'} must define {NAMESPACE_LINE!r} exactly once")
    ops_file.write_text(text.replace(NAMESPACE_LINE, f'NAMESPACE = "{namespace}"'))
    general = build["general"]
    metadata = {
        "name": general["name"],
        "id": namespace,
        "version": general["version"],
        "license": general["license"],
        "python-depends": [],
        "backend": {"type": backend, **({"archs": archs} if archs else {})},
    }
    (variant / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    return variant


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="ltx-kernels export-hub", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", help="kernel repository directory to write (build/<variant>/ inside)")
    parser.add_argument("--source", default=".", help="ltx-kernels checkout to build (default: .)")
    parser.add_argument("--backend", choices=["cuda", "cpu"], help="default: cuda when torch has CUDA")
    parser.add_argument("--archs", nargs="+", help="CUDA capabilities, e.g. 9.0a (default: build.toml's)")
    args = parser.parse_args(argv)
    variant = export(args.outdir, args.source, args.backend, args.archs)
    print(f"wrote {variant}")
    return 0

"""README.md runs as written and stands alone.

- Every ```python block runs, each in a fresh interpreter (no block builds on another), in an
  empty working directory, within TIME_LIMIT seconds; a failure names the block's line. A
  block that cannot run here (a download, a GPU, a build) has ``<!-- not run: why -->`` on
  the line before its fence, and must still compile.
- Every ```bash block names only scripts and files that exist and modules that import.
- Every repository path the README mentions exists, and it names no document outside the
  repository.
"""

import importlib.util
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import ltx_kernels

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TIME_LIMIT = 300  # seconds per block; the slowest (the Python API, torch.compile included) takes ~15 on 2 cores
NOT_RUN = re.compile(r"<!-- not run: \S.* -->")
# Source folders of the repository: a path starting with one of them must exist (build/ is
# an output folder, not checked).
FOLDERS = (".ci", "benchmarks", "examples", "include", "python", "scripts", "src", "tests")


def code_blocks() -> list[tuple[str, int, str, bool]]:
    """(language, line of the opening fence, code, marked not run) of every fenced block."""
    lines = README.read_text().splitlines()
    blocks, fence = [], None
    for number, line in enumerate(lines, 1):
        if fence is None and line.startswith("```"):
            fence = (line[3:].strip(), number, NOT_RUN.fullmatch(lines[number - 2].strip()) is not None)
            body = []
        elif fence is not None and line.startswith("```"):
            blocks.append((fence[0], fence[1], "\n".join(body), fence[2]))
            fence = None
        elif fence is not None:
            body.append(line)
    assert fence is None, f"README.md:{fence[1]}: unclosed code block"
    return blocks


BLOCKS = code_blocks()
PYTHON = [(line, code) for lang, line, code, skip in BLOCKS if lang == "python" and not skip]
NOT_RUN_PYTHON = [(line, code) for lang, line, code, skip in BLOCKS if lang == "python" and skip]
SHELL = [(line, code) for lang, line, code, _ in BLOCKS if lang == "bash"]
with open(ROOT / "pyproject.toml", "rb") as f:
    SCRIPTS = tomllib.load(f)["project"]["scripts"]  # the commands pip installs


def padded(line: int, code: str) -> str:
    """``code`` moved down to its line in README.md, so tracebacks give README line numbers."""
    return "\n" * line + code


def test_blocks_are_found():
    assert len(PYTHON) >= 2 and SHELL, "README.md lost its runnable examples"


@pytest.mark.parametrize("line, code", PYTHON, ids=[f"README.md:{line}" for line, _ in PYTHON])
def test_python_block_runs(line, code, tmp_path):
    # The package as this test imports it (installed, or through PYTHONPATH).
    path = os.pathsep.join([str(Path(ltx_kernels.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    run = "import sys; exec(compile(sys.stdin.read(), 'README.md', 'exec'), {'__name__': '__main__'})"
    try:
        done = subprocess.run([sys.executable, "-c", run], input=padded(line, code), capture_output=True,
                              text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": path}, timeout=TIME_LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"README.md:{line}: the python block ran past {TIME_LIMIT} s")
    assert done.returncode == 0, f"README.md:{line}: the python block failed:\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("line, code", NOT_RUN_PYTHON, ids=[f"README.md:{line}" for line, _ in NOT_RUN_PYTHON])
def test_python_block_not_run_compiles(line, code):
    compile(padded(line, code), "README.md", "exec")


@pytest.mark.parametrize("line, code", SHELL, ids=[f"README.md:{line}" for line, _ in SHELL])
def test_shell_block_names_what_exists(line, code):
    for n, command in enumerate(code.splitlines(), line + 1):
        for script in re.findall(r"(?:bash|python)\s+([\w./-]+\.(?:sh|py))\b", command):
            assert (ROOT / script).is_file(), f"README.md:{n}: {script} does not exist"
        for module in re.findall(r"python -m ([\w.]+)", command):
            assert importlib.util.find_spec(module) is not None, f"README.md:{n}: module {module} does not import"
        for tool in re.findall(r"(?:^|[\s/])(ltx-[\w-]+)\s", command):
            assert tool in SCRIPTS, f"README.md:{n}: {tool} is not a command of the package"


def _expand(path: str) -> list[str]:
    """Brace expansion as the shell does it: ``a.{md,json}`` -> ``a.md``, ``a.json``."""
    parts = re.split(r"\{([^{}]*)\}", path)
    options = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(choice) for choice in itertools.product(*options)]


def test_repository_paths_exist():
    text = README.read_text()
    pattern = rf"(?<![\w./-])((?:{'|'.join(map(re.escape, FOLDERS))})/[\w.{{}},*/-]*)"
    missing = set()
    for match in re.finditer(pattern, text):
        path = match.group(1).rstrip(".,")
        for name in _expand(path):
            if not any(ROOT.glob(name.rstrip("/"))):
                missing.add(f"README.md:{text.count(chr(10), 0, match.start()) + 1}: {name}")
    assert not missing, "paths that do not exist:\n" + "\n".join(sorted(missing))


def test_links_stay_in_the_repository():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", text):
        if not re.match(r"https?://", target):
            assert (ROOT / target).exists(), f"README.md links to {target}, which is not in the repository"
    # Documents by name (DESIGN.md, ANCHORS.md, ...) must be files of the repository.
    for name in set(re.findall(r"\b[A-Z][A-Z_]+\.md\b", text)):
        assert (ROOT / name).is_file(), f"README.md names {name}, which is not in the repository"

"""The compiled library and the torch.ops namespace its ops are registered under.

``ltx-kernels export-hub`` copies this package next to a library compiled with a
build-unique namespace and rewrites ``NAMESPACE`` in its copy of this file.
"""

from pathlib import Path

import torch

NAMESPACE = "ltx_kernels"

torch.ops.load_library(str(Path(__file__).with_name("_C.so")))
ops = getattr(torch.ops, NAMESPACE)


def add_op_namespace_prefix(op_name: str) -> str:
    """``"rms_norm"`` -> ``"<namespace>::rms_norm"`` (for torch.library registrations)."""
    return f"{NAMESPACE}::{op_name}"

"""The HuggingFace Kernels Hub route, end to end and offline.

    python examples/huggingface_kernels_example.py [--out ltx-kernels-hub] [--backend cuda|cpu]

1. ``ltx-kernels export-hub``: build this checkout into a kernel repository directory
   (``OUT/build/<variant>/``, what ``kernels upload`` would publish);
2. ``kernels.get_local_kernel(OUT)``: load it as the ``kernels`` package loads Hub kernels and
   call an op;
3. ``kernels.kernelize`` with ``LocalLayerRepository`` mappings: swap a transformers model's
   RMSNorm and GELU-tanh activation for our layers, compile it, and compare with stock.

After an upload, the same code works with ``get_kernel("<org>/ltx-kernels", version=1)`` and
``LayerRepository(repo_id="<org>/ltx-kernels", layer_name="RMSNorm", version=1)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import kernels
import torch
from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping
from transformers import AutoConfig, AutoModelForCausalLM

from ltx_kernels import hub

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("ltx-kernels-hub"))
    parser.add_argument("--backend", choices=["cuda", "cpu"], help="default: cuda when a GPU is present")
    args = parser.parse_args()
    backend = args.backend or ("cuda" if torch.cuda.is_available() else "cpu")
    device = "cuda" if backend == "cuda" else "cpu"

    variant = hub.export(args.out, REPO, backend)
    print(f"1. exported {variant}")

    # A CPU variant under a CUDA build of torch is not what kernels picks for this machine,
    # so it is loaded by its variant path; a CUDA variant through the repository directory.
    repo = args.out if backend == "cuda" or torch.version.cuda is None else variant
    kernel = kernels.get_local_kernel(repo, backend=backend)
    x = torch.randn(4, 4096, device=device, dtype=torch.bfloat16)
    w = torch.randn(4096, device=device, dtype=torch.bfloat16)
    out = kernel.rms_norm(x, w, 1e-6)
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
    print(f"2. get_local_kernel -> {kernel.__name__}; rms_norm rel. error vs fp32 formula "
          f"{((out.float() - ref).norm() / ref.norm()).item():.1e}")

    config = AutoConfig.for_model(
        "llama", vocab_size=1000, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, hidden_act="gelu_pytorch_tanh",
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(device).eval()
    ids = torch.randint(0, 1000, (2, 32), device=device)
    with torch.no_grad():
        stock = model(ids).logits
    mapping = {name: {device: LocalLayerRepository(repo_path=repo, layer_name=name)} for name in ("RMSNorm", "GeluTanh")}
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device=device)
    swapped = sorted({type(m).__name__ for m in model.modules() if m.forward.__func__.__module__.endswith(".layers")})
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    with torch.no_grad():
        ours = compiled(ids).logits
    print(f"3. kernelize swapped {swapped}; compiled logits rel. error vs stock "
          f"{((ours - stock).norm() / stock.norm()).item():.1e}")


if __name__ == "__main__":
    main()

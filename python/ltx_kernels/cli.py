"""``ltx-kernels`` command line: ``ltx-kernels bench [...]`` (the memory-bound ops),
``ltx-kernels bench attention|gemm [...]``, ``ltx-kernels export-hub OUTDIR [...]``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("bench", "export-hub"):
        print(
            "usage: ltx-kernels bench [--json FILE] [--markdown FILE] [--ops OP ...]\n"
            "       ltx-kernels bench attention|gemm [--json FILE] [--markdown FILE]\n"
            "       ltx-kernels export-hub OUTDIR [--source DIR] [--backend cuda|cpu]",
            file=sys.stderr,
        )
        return 2
    if argv[0] == "export-hub":
        from ltx_kernels.hub import main as export_main

        return export_main(argv[1:])
    if argv[1:2] == ["attention"]:
        from ltx_kernels.bench.attention import main as attention_main

        return attention_main(argv[2:])
    if argv[1:2] == ["gemm"]:
        from ltx_kernels.bench.gemm import main as gemm_main

        return gemm_main(argv[2:])
    from ltx_kernels.bench.__main__ import main as bench_main

    return bench_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

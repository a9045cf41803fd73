"""``ltx-kernels`` command line: ``ltx-kernels bench [...]``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("bench",):
        print("usage: ltx-kernels bench [--json FILE] [--markdown FILE] [--ops OP ...]", file=sys.stderr)
        return 2
    from ltx_kernels.bench.__main__ import main as bench_main

    return bench_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

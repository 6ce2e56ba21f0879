"""Run the benchmarks: ``python -m bench [SECTION ...]``.

Each section is a module of this package exposing ``run() -> str`` that returns a
Markdown block (tables of measured figures side by side with the baseline).  The
blocks are printed on stdout and written to ``bench/out/RESULTS.md``.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

#: Sections, in order.  A section whose module is absent is skipped with a note.
#: ``tuning`` (the defaults on their own source) comes before the sections that report.
SECTIONS = ("deepep", "gpu_microbench", "ingest", "planning", "tuning", "latency", "replan",
            "scale", "online")

SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def main(argv: list[str]) -> int:
    chosen = argv or list(SECTIONS)
    blocks = []
    for name in chosen:
        try:
            module = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"bench.{name}":
                raise
            blocks.append(f"## {name}\n\n(section not available)\n")
            continue
        t0 = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        block = module.run()
        print(f"[bench] {name} done in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        print(block, flush=True)
        blocks.append(block)
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "RESULTS.md").write_text("\n".join(blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

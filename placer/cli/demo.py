"""``make demo``: plan the bundled Qwen3-30B-A3B statistics on two DGX H100 nodes.

Runs the real command::

    placer plan traces/qwen3-30b-a3b.npz --topology 2x-dgx-h100 --model qwen3-30b-a3b \\
        --redundant 16 --engine sglang --output out/demo/qwen3-30b-a3b-2x-dgx-h100.json \\
        --export sglang:out/demo/qwen3-30b-a3b-2x-dgx-h100.sglang.json \\
        --export trtllm:out/demo/qwen3-30b-a3b-2x-dgx-h100.trtllm.yaml

with the default solver (``cpsat``), planned and judged for SGLang's static dispatch at
decode batch sizes, which writes the placement and prints the summary with its
side-by-side against DeepSeek EPLB (estimated times, verdict), then the SGLang and
TensorRT-LLM files of the plan and how to load them.  ``python -m placer.cli.demo [EXTRA OPTIONS]``
passes extra options to ``placer plan`` (for example ``--time-limit 2``).

It makes the output folder first (``placer`` creates none), and ends, when ``placer`` is
not on the shell's PATH (``make`` installs it in ``.venv``, which a shell has not
activated), with how to run the README's tour: :data:`NEXT`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from placer.cli.main import app

#: The bundled statistics (MIT, see traces/README.md), relative to the repository root.
TRACE = Path("traces") / "qwen3-30b-a3b.npz"
OUTPUT = Path("out") / "demo" / "qwen3-30b-a3b-2x-dgx-h100.json"
#: The plan's engine files (``placer plan --export``).
SGLANG_OUTPUT = OUTPUT.with_name(f"{OUTPUT.stem}.sglang.json")
TRTLLM_OUTPUT = OUTPUT.with_name(f"{OUTPUT.stem}.trtllm.yaml")


def demo_args(root: Path, extra: list[str]) -> list[str]:
    """Arguments of the ``placer plan`` command the demo runs."""
    return [
        "plan", str(root / TRACE),
        "--topology", "2x-dgx-h100", "--model", "qwen3-30b-a3b",
        "--redundant", "16", "--engine", "sglang",
        "--output", str(root / OUTPUT),
        "--export", f"sglang:{root / SGLANG_OUTPUT}",
        "--export", f"trtllm:{root / TRTLLM_OUTPUT}",
        *extra,
    ]


#: What the demo says last when ``placer`` is not on the PATH: the README's tour types
#: ``placer ...``, which the shell finds only once ``.venv`` is activated.
NEXT = (
    "\nnext: the README's tour runs `placer ...`, installed in .venv, which this shell has"
    " not activated:\n"
    "  source .venv/bin/activate    # or `make shell`, a shell with it on PATH\n"
    "  placer plan -h               # (or run .venv/bin/placer without activating)\n"
)


def main(argv: list[str] | None = None) -> None:
    root = Path.cwd()
    if not (root / TRACE).exists():
        root = Path(__file__).resolve().parent.parent
    args = demo_args(root, list(sys.argv[1:] if argv is None else argv))
    folder = root / OUTPUT.parent
    sys.stderr.write(f"$ mkdir -p {folder}\n")
    folder.mkdir(parents=True, exist_ok=True)
    sys.stderr.write("$ placer " + " ".join(args) + "\n")
    try:
        app(args, prog_name="placer")
    except SystemExit as done:
        if done.code in (0, None) and shutil.which("placer") is None:
            sys.stderr.write(NEXT)
        raise


if __name__ == "__main__":
    main()

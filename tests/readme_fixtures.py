"""Console examples that run as written: the README's and docs/*.md's.

:func:`doc_examples` reads the ``$ ...`` commands of a Markdown file's fenced blocks and
the output lines shown under each; :func:`check_examples` runs them in order, with a
shell, in one working directory, and compares every shown line with what the command
printed (figures masked, spacing collapsed: :func:`skeleton`).  The rest are the files
the commands read that the repository does not bundle: an engine's recorder dumps,
statistics folders and measured timings, small but shaped as the real ones (DeepSeek-V3:
61 hidden layers, MoE layers 3-60, 256 experts, top-8).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import console
import numpy as np
import pytest
from console import Ran
from safetensors_fixture import write_safetensors

from placer.io.ptfile import save_pt

REPO = Path(__file__).resolve().parent.parent
HIDDEN_LAYERS, FIRST_MOE, EXPERTS, TOP_K = 61, 3, 256, 8

#: What the working directory's path reads as in the shown output (``placer config``
#: prints absolute paths).
SHOWN_WORKDIR = "/work"


# -- the examples of a Markdown file -----------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One ``$ ...`` command of a fenced block (continuation lines joined) and the output
    lines shown under it (blank lines and ``...``, which marks lines left out, dropped);
    ``line`` is its line in the file; ``lines`` the shown lines with the ``...`` marks
    (``shown_output.differences`` reads where lines were left out)."""

    command: str
    shown: tuple[str, ...]
    line: int
    lines: tuple[str, ...] = ()

    @property
    def fails(self) -> bool:
        """The example shows an error: the command must exit 1 or 2 (never 3, a bug)."""
        return any(s.startswith("error:") for s in self.shown)


def doc_examples(text: str) -> list[Example]:
    """Every ``$ ...`` command of ``text``'s fenced blocks, in order, with its shown lines."""
    examples: list[Example] = []
    inside = False
    pending: str | None = None
    current: tuple[str, int, list[str]] | None = None
    start = 0

    def close() -> None:
        if current is not None:
            lines = tuple(current[2])
            examples.append(Example(current[0], tuple(s for s in lines if s.strip() != "..."),
                                    current[1], lines))

    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            close()
            inside, current, pending = not inside, None, None
            continue
        if not inside:
            continue
        if pending is not None or line.startswith("$ "):
            if pending is None:
                start, pending = number, line[2:].strip()
            else:
                pending += " " + line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            close()
            current, pending = (pending, start, []), None
        elif current is not None and line.strip():
            current[2].append(line)
    close()
    return examples


def skeleton(line: str) -> str:
    """A line with its figures masked and its spacing collapsed: what must not drift."""
    masked = re.sub(r"\d+(?:[.,]\d+)*", "#", line)
    return " ".join(masked.replace("─", "").split())


def check_example(example: Example, ran: Ran, workdir: Path, *, name: str) -> int:
    """``example`` exited 0 (1 or 2 when it shows an ``error:`` line), printed no
    traceback and still printed every line it shows; returns the number of lines compared."""
    where = f"{name}:{example.line}: $ {example.command}"
    printed_text = (ran.stdout + ran.stderr).replace(str(workdir), SHOWN_WORKDIR)
    tail = f"{ran.stdout[-2000:]}\n{ran.stderr[-2000:]}"
    expected = (1, 2) if example.fails else (0,)
    assert ran.returncode in expected, f"{where}\nexit code {ran.returncode}\n{tail}"
    assert "Traceback" not in ran.stderr, f"{where}\n{tail}"
    printed = {skeleton(line) for line in printed_text.splitlines()}
    missing = [line for line in example.shown if skeleton(line) not in printed]
    assert missing == [], (f"{where}\nshows lines it no longer prints:\n"
                           + "\n".join(missing) + f"\n--- it printed:\n{printed_text}")
    return len(example.shown)


def check_examples(examples: list[Example], workdir: Path, *, name: str,
                   in_shell: bool = False) -> int:
    """Run ``examples`` in order in ``workdir`` (with bash and the installed ``placer``
    when ``in_shell``, else in this process where they can: ``console.run``) and check
    each (:func:`check_example`).  Returns the number of shown lines compared."""
    return sum(check_example(e, console.run(e.command, workdir, in_shell=in_shell), workdir,
                             name=name) for e in examples)


def is_slow(example: Example, slow: dict[str, str] | None) -> bool:
    """Whether ``example``'s command holds a key of ``slow`` (a part of a command: why)."""
    return any(key in example.command for key in slow or {})


class Walkthrough:
    """A page's examples run in order in one working directory, one check at a time.

    :meth:`check` first runs the examples before the one asked for that have not run yet
    (their files are its inputs; their own checks are theirs), except slow ones (``slow``,
    as :func:`example_params` marks them): ``make test`` leaves those out, so an example of
    the fast tier must not read what a slow one writes (it then fails, and is marked slow
    too).  Commands run in this process with the plans' search cut (``console.run``'s
    ``quick``)."""

    def __init__(self, examples: list[Example], workdir: Path, name: str,
                 slow: dict[str, str] | None = None) -> None:
        self.examples, self.workdir, self.name, self.slow = examples, workdir, name, slow
        self.ran = 0

    def run(self, example: Example) -> Ran:
        """Run the examples before ``example`` not run yet, then ``example``: what it did."""
        index = self.examples.index(example)
        for earlier in self.examples[self.ran:index]:
            if not is_slow(earlier, self.slow):
                console.run(earlier.command, self.workdir, quick=True)
        self.ran = max(self.ran, index + 1)
        return console.run(example.command, self.workdir, quick=True)

    def check(self, example: Example) -> int:
        return check_example(example, self.run(example), self.workdir, name=self.name)


def example_params(examples: list[Example], name: str,
                   slow: dict[str, str] | None = None) -> list[Any]:
    """One pytest parameter per example, ``name:line`` as its id (``conftest.xdist_group``
    sends the examples of one ``name`` to one worker, which runs them in order in one
    working directory).  An example whose command holds a key of ``slow`` is marked
    ``slow`` (the value says why): ``make test`` leaves it to the slow tier."""
    return [pytest.param(example, id=f"{name}:{example.line}",
                         marks=[pytest.mark.slow] if is_slow(example, slow) else [])
            for example in examples]


# -- the files the examples read ---------------------------------------------------------------


def _choices(rng: np.random.Generator, tokens: int, skew: float = 0.8) -> np.ndarray:
    """``[tokens, TOP_K]`` distinct experts per token, skewed (a few hot experts: Zipf's
    exponent ``skew``)."""
    weights = 1.0 / np.arange(1, EXPERTS + 1) ** skew
    keys = np.log(weights)[None, :] + rng.gumbel(size=(tokens, EXPERTS))
    return np.argsort(-keys, axis=1)[:, :TOP_K]


def sglang_dumps(folder: Path, ranks: int = 2, passes: int = 2, tokens: int = 32,
                 stamp: str = "1700000000.5") -> None:
    """SGLang per_token recorder dumps, one file per rank, as
    ``expert_distribution_recorder_{stamp}_{rank}.pt`` (no redundant experts: the
    physical-to-logical map is the identity)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    p2l = np.tile(np.arange(EXPERTS, dtype=np.int64), (HIDDEN_LAYERS, 1))
    for rank in range(ranks):
        records = []
        for step in range(passes):
            topk = np.full((HIDDEN_LAYERS, tokens, TOP_K), -1, dtype=np.int32)
            for layer in range(FIRST_MOE, HIDDEN_LAYERS):
                topk[layer] = _choices(rng, tokens)
            records.append({
                "forward_pass_id": step, "rank": rank, "gatherer_key": "primary",
                "input_ids": list(range(tokens)), "positions": list(range(tokens)),
                "extend_seq_lens": [tokens], "forward_mode": 1, "topk_ids_of_layer": topk,
                "misc_objects": [],
                "global_physical_count": np.zeros((HIDDEN_LAYERS, EXPERTS), dtype=np.int32),
            })
        save_pt({"records": records, "last_physical_to_logical_map": p2l},
                folder / f"expert_distribution_recorder_{stamp}_{rank}.pt")


def trtllm_statistics(folder: Path, ranks: int = 2, iterations: tuple[int, ...] = (100, 101),
                      tokens: int = 64, experts: int = EXPERTS, skew: float = 0.8) -> None:
    """TensorRT-LLM expert statistics (``EXPERT_STATISTIC_PATH``): ``meta_info.json`` and
    ``rank{r}.safetensors`` keyed ``"{iteration}_{layer}"``, counts over the experts
    (``experts`` above the model's: the load balancer's slots)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta_info.json").write_text(
        json.dumps({"num_experts": experts, "num_experts_per_token": TOP_K}))
    rng = np.random.default_rng(8)
    for rank in range(ranks):
        tensors = {}
        for it in iterations:
            for layer in range(FIRST_MOE, HIDDEN_LAYERS):
                picks = _choices(rng, tokens, skew).ravel()
                tensors[f"{it}_{layer}"] = np.bincount(picks, minlength=experts)
        write_safetensors(folder / f"rank{rank}.safetensors", tensors)


def timings(path: Path) -> None:
    """A timings CSV as ``placer calibrate`` reads it: DeepEP's published rows (the
    measurements a cluster's own run would give, in the same format)."""
    shutil.copyfile(REPO / "bench" / "data" / "deepep_v1.csv", path)


def readme_workdir(folder: Path) -> Path:
    """A working directory holding every input the README's commands name."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "traces").symlink_to(REPO / "traces", target_is_directory=True)
    (folder / "bench").symlink_to(REPO / "bench", target_is_directory=True)  # bench/data
    sglang_dumps(folder / "dumps")
    trtllm_statistics(folder / "stats")
    timings(folder / "timings.csv")
    return folder


# -- the files docs/*.md's examples read ------------------------------------------------------


def fenced(doc: str, lang: str, containing: str) -> str:
    """The first ``lang`` fenced block of docs/``doc`` holding ``containing``: a file the
    page shows is the file its commands read."""
    text = (REPO / "docs" / doc).read_text(encoding="utf-8")
    for block in re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M):
        if containing in block:
            return block
    raise LookupError(f"docs/{doc}: no {lang} block holds {containing!r}")


def run_placer(folder: Path, *args: str) -> None:
    """``placer ARGS`` in ``folder`` (a file an example reads that placer itself writes),
    in this process, with the plans' search cut (the examples read the file, not its
    quality)."""
    ran = console.in_process(list(args), folder, quick=True)
    assert ran.returncode == 0, f"placer {' '.join(args)}\n{ran.stderr}"


def _hostile(folder: Path, case: str, name: str) -> None:
    """The input of ``tests/hostile_corpus.py``'s ``case`` as ``folder/name``."""
    from hostile_corpus import CASES

    home = folder / ".cases" / case
    home.mkdir(parents=True)
    build = next(c.build for c in CASES if c.name == case)
    made = Path(next(a for a in build(home) if a.startswith(str(home))))
    made.rename(folder / name)


def _mixtral(folder: Path) -> None:
    """``small.npz`` (a Mixtral-8x7B trace) and ``eplb.json``: EPLB's plan of it on one
    8-GPU node with 8 redundant experts (it doubles up hot experts on some GPUs)."""
    run_placer(folder, "synth", "small.npz", "-m", "mixtral-8x7b", "-n", "2048", "--zipf",
               "1.2", "--seed", "3")
    run_placer(folder, "plan", "small.npz", "-m", "mixtral-8x7b", "-t", "dgx-h100", "-r", "8",
               "--solver", "eplb", "-o", "eplb.json")


def _cli(folder: Path) -> None:
    (folder / "proj").mkdir()
    (folder / "proj" / "placer.toml").write_text(fenced("cli.md", "toml", "# placer.toml"))


def _hardware(folder: Path) -> None:
    text = fenced("hardware.md", "yaml", "name: lab-a100")
    (folder / "my-cluster.yaml").write_text(text)
    (folder / "typo.yaml").write_text(text.replace("gbps: 300", "gpbs: 300", 1))


def _models(folder: Path) -> None:
    from hf_configs import CONFIGS

    (folder / "DeepSeek-V3").mkdir()
    doc = {**CONFIGS["deepseek-v3"],
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (folder / "DeepSeek-V3" / "config.json").write_text(json.dumps(doc, indent=2))
    bad = {**CONFIGS["qwen3-30b-a3b"], "quantization_config": {"quant_method": "awq"}}
    (folder / "bad.json").write_text(json.dumps(bad, indent=2))


def _traces(folder: Path) -> None:
    (folder / "load.csv").write_text("layer,expert,load\n0,0,12\n0,1,7\n0,2,5\n0,3,1\n")
    trtllm_statistics(folder / "stats", experts=288)
    (folder / "bad.jsonl").write_text(
        '{"format": "placer-trace", "num_experts": 8, "top_k": 2}\n'
        '{"token": 0, "layer": 0, "experts": [1, 9]}\n')


def _limits(folder: Path) -> None:
    for case, name in (("jsonl-id-32767-accepted", "stray.jsonl"),
                       ("jsonl-expert-32768", "one-line.jsonl"),
                       ("jsonl-gzip-blank-bomb", "blank.jsonl.gz"),
                       ("pt-zero-stride-bomb", "dump.pt"),
                       ("topology-laughs", "laughs.yaml"),
                       ("model-layers-10^8", "huge.yaml"),
                       ("trtllm-nan-float-counts", "stat")):
        _hostile(folder, case, name)


def _calibrate(folder: Path) -> None:
    timings(folder / "deepep_v1.csv")
    (folder / "h800-nominal.yaml").write_text(
        fenced("calibrate.md", "yaml", "extends: dgx-h800\n"))


def _engines(folder: Path) -> None:
    _mixtral(folder)
    sglang_dumps(folder / "sglang_dump", ranks=4, passes=8, stamp="1764520000.0")
    trtllm_statistics(folder / "expert_statistic", iterations=tuple(range(100, 120)))
    (folder / "bad.json").write_text(json.dumps(
        {"physical_to_logical_map": [list(range(EXPERTS))] * HIDDEN_LAYERS, "ep_size": 32}))


def _placement(folder: Path) -> None:
    _mixtral(folder)
    run_placer(folder, "export", "eplb.json", "-f", "sglang", "-o", "init.json")
    np.savez(folder / "mix.npz", load=np.array([[410, 95, 120, 60, 88, 71, 130, 26],
                                               [52, 180, 64, 143, 37, 98, 300, 126]]),
             top_k=np.int64(2))
    doc = json.loads((folder / "eplb.json").read_text())
    doc["layers"][1]["physical_to_logical"] = [
        0 if e == 7 else e for e in doc["layers"][1]["physical_to_logical"]]
    (folder / "bad.json").write_text(json.dumps(doc))


def _compare(folder: Path) -> None:
    (folder / "study.yaml").write_text(fenced("compare.md", "console", "$ cat study.yaml")
                                       .split("$ cat study.yaml\n", 1)[1].split("\n$ ", 1)[0])
    (folder / "bad.yaml").write_text("model: gpt-oss-20b\ntopologies: [dgx-h100]\nsolver: [eplb]\n")


#: What each page's examples read beyond the bundled traces.
DOC_INPUTS = {"cli.md": _cli, "hardware.md": _hardware, "models.md": _models,
              "traces.md": _traces, "limits.md": _limits, "calibrate.md": _calibrate,
              "engines.md": _engines, "placement.md": _placement, "compare.md": _compare}


def docs_workdir(folder: Path, doc: str) -> Path:
    """A working directory holding every input docs/``doc``'s examples name: a copy of the
    bundled traces (an example may write over one), the test fixtures, and the page's own
    files (:data:`DOC_INPUTS`)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "traces", folder / "traces")
    (folder / "tests").mkdir()
    (folder / "tests" / "fixtures").symlink_to(REPO / "tests" / "fixtures",
                                               target_is_directory=True)
    if doc in DOC_INPUTS:
        DOC_INPUTS[doc](folder)
    return folder

"""An operator's first day: the stumbles newcomers reported, each driven through the
command line as they typed it, with the answer a user should get.

The ten of them, in order (the sections below):

1. an output in a folder that does not exist (``synth`` to NPZ and JSONL, ``replay
   --report``, ``compare --png-dir``): an error naming the folder, with ``mkdir -p``;
2. a trace of one model planned (or replayed) as another: an error naming both models and
   what differs;
3. ``report`` judges as the plans record; ``compare``'s page has the recommendation and the
   warnings;
4. ``replay -P eplb``: a hint whose example runs; ``--policy sglang``: pointed to ``--dispatch``;
5. the replay's verdict names the kind that won, prints engine flags only for the setting
   it recommends, its table says where each online policy started, and a short replay says
   no rebalance could pay back;
6. the tour's plans warn only what is worth acting on, and reading a plan back does not
   warn again about what its plan said;
7. ``-e`` help names what the output says; a ``-r`` hint suggests what the memory holds;
   a mistyped topology suggests the preset;
8. ``synth`` says its progress when stderr is not a terminal;
9. the tour writes only under ``out/``; the ``2x-gb200-nvl72`` preset exists;
10. ``-r 992`` on 16 GPUs finishes within 60 s and 2 GB.

Most run in this process (``console.run``, as the README's tests do); those that need a
real process or a whole-model plan are left to the slow tier.
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import console
import numpy as np
import pytest
from readme_fixtures import doc_examples, readme_workdir
from shown_output import WRITES

REPO = Path(__file__).resolve().parent.parent
QWEN3 = REPO / "traces" / "qwen3-30b-a3b.npz"
SMALL = REPO / "traces" / "synthetic-small.jsonl.gz"
DSV3 = REPO / "traces" / "synthetic-dsv3-drift.npz"
#: The README's tour replay, on a fifth of a second of serving.
REPLAY = (f"placer replay {DSV3} -m deepseek-v3 -t 4x-dgx-h100 -r 32 --tokens-per-gpu 16")


def _placer(command: str, workdir: Path) -> console.Ran:
    """``placer ...`` as typed, in ``workdir`` (in this process, plans' search cut)."""
    return console.run(command, workdir, quick=True)


def _messages(stderr: str, kind: str = "warning") -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{kind}:")]


# -- 1. an output in a folder that does not exist -------------------------------------------


@pytest.mark.parametrize(("command", "flag", "folder"), [
    ("placer synth missing/trace.npz --tokens 256 --layers 2 --experts 8 --top-k 2",
     "OUTPUT", "missing"),
    ("placer synth missing/trace.jsonl --tokens 256 --layers 2 --experts 8 --top-k 2",
     "OUTPUT", "missing"),
    (f"{REPLAY} -P static:default --report missing/replay.html", "--report", "missing"),
    (f"placer compare {SMALL} -m gpt-oss-20b -t dgx-h100 --png-dir missing/png", "--png-dir",
     "missing/png"),
], ids=["synth-npz", "synth-jsonl", "replay-report", "compare-png-dir"])
def test_1_an_output_in_a_missing_folder_is_refused_at_once(command, flag, folder, tmp_path):
    ran = _placer(command, tmp_path)
    assert ran.returncode == 2, ran.stderr
    assert _messages(ran.stderr, "error") == [f"error: {flag}: folder {folder} does not exist"]
    hint = _messages(ran.stderr, "hint")
    assert len(hint) == 1 and f"(mkdir -p {folder})" in hint[0]
    assert not (tmp_path / "missing").exists() and ran.stdout == ""


# -- 2. a trace recorded on another model than --model ----------------------------------------


def test_2_a_trace_declaring_another_model_is_an_error_naming_both(tmp_path: Path) -> None:
    """The bundled trace declares qwen3-30b-a3b (48 MoE layers); planning it as
    qwen3-235b-a22b (94) once succeeded and failed only at export."""
    ran = _placer(f"placer plan {QWEN3} -m qwen3-235b-a22b -t 2x-dgx-h100 --solver eplb"
                  " -o plan.json", tmp_path)
    assert ran.returncode == 1, ran.stderr
    [error] = _messages(ran.stderr, "error")
    assert error == (f"error: {QWEN3}: the trace declares model qwen3-30b-a3b but --model is"
                     " qwen3-235b-a22b (the trace covers 48 of qwen3-235b-a22b's 94 MoE layers:"
                     " 0-47)")
    [hint] = _messages(ran.stderr, "hint")
    assert "--allow-model-mismatch" in hint and "--model qwen3-30b-a3b" in hint
    assert "Traceback" not in ran.stderr
    assert not (tmp_path / "plan.json").exists()


def test_2_the_override_turns_the_mismatch_into_a_warning_naming_both(tmp_path: Path) -> None:
    ran = _placer(f"placer plan {QWEN3} -m qwen3-235b-a22b -t 2x-dgx-h100 --solver eplb"
                  " --allow-model-mismatch -o plan.json -q", tmp_path)
    assert ran.returncode == 0, ran.stderr
    [warning] = [w for w in _messages(ran.stderr) if "declares model" in w]
    assert "qwen3-30b-a3b" in warning and "qwen3-235b-a22b" in warning
    assert (tmp_path / "plan.json").exists()


def test_2_the_trace_on_its_own_model_reads_without_a_word_about_models() -> None:
    from placer.model import load_model
    from placer.planning.build import check_trace_model
    from placer.traces import read_routing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = read_routing(QWEN3).stats
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_trace_model(stats, load_model("qwen3-30b-a3b"))


def _planned(factory: pytest.TempPathFactory, name: str, command: str) -> Path:
    """``command`` (a ``placer plan`` writing ``plan.json``) run in a folder of its own."""
    folder = factory.mktemp(name)
    ran = _placer(f"{command} -o plan.json -q", folder)
    assert ran.returncode == 0, ran.stderr
    return folder / "plan.json"


@pytest.fixture(scope="module")
def qwen3_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _planned(tmp_path_factory, "qwen3",
                    f"placer plan {QWEN3} -m qwen3-30b-a3b -t 2x-dgx-h100 --solver eplb")


@pytest.mark.parametrize("command", ["compare", "evaluate", "report"])
def test_2_every_command_that_reads_a_trace_for_a_model_checks_the_declared_one(
        command: str, qwen3_plan: Path, tmp_path: Path) -> None:
    args = {"compare": "-t 2x-dgx-h100", "evaluate": f"-p {qwen3_plan}",
            "report": f"-p {qwen3_plan} -o r.html"}[command]
    ran = _placer(f"placer {command} {QWEN3} -m qwen3-235b-a22b {args}", tmp_path)
    assert ran.returncode == 1, ran.stderr
    assert ("error: " + str(QWEN3) + ": the trace declares model qwen3-30b-a3b but --model"
            " is qwen3-235b-a22b") in ran.stderr
    assert "hint: give --model qwen3-30b-a3b, or pass --allow-model-mismatch" in ran.stderr
    assert ran.stdout == ""


def _qwen3_tokens(path: Path) -> Path:
    """64 tokens of Qwen3-30B-A3B's shape (48 layers, 128 experts, top-8) that say so."""
    from placer.traces import write_jsonl_trace, write_npz_trace

    rng = np.random.default_rng(0)
    topk = np.argsort(rng.random((64, 48, 128)), axis=2)[:, :, :8].astype(np.int32)
    write = write_npz_trace if path.suffix == ".npz" else write_jsonl_trace
    write(path, topk, layer_ids=np.arange(48),
          meta={"model": "qwen3-30b-a3b", "num_experts": 128, "top_k": 8})
    return path


@pytest.mark.parametrize("name", ["q3.npz", "q3.jsonl"])
def test_2_replay_checks_the_model_a_per_token_trace_declares(name: str, tmp_path: Path) -> None:
    """Replay streams an NPZ trace (its header is checked before any step) and reads a
    JSONL one whole: both say the model they declare, and replay checks it as plan does."""
    trace = _qwen3_tokens(tmp_path / name)
    ran = _placer(f"placer replay {trace} -m qwen3-235b-a22b -t 2x-dgx-h100", tmp_path)
    assert ran.returncode == 1, ran.stderr
    assert _messages(ran.stderr, "error") == [
        f"error: {trace}: the trace declares model qwen3-30b-a3b but --model is"
        " qwen3-235b-a22b (the trace covers 48 of qwen3-235b-a22b's 94 MoE layers: 0-47)"]
    assert "--allow-model-mismatch" in ran.stderr
    assert ran.stdout == ""
    allowed = _placer(f"placer replay {trace} -m qwen3-235b-a22b -t 2x-dgx-h100 -P"
                      " static:default --allow-model-mismatch -q", tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    [warning] = [w for w in _messages(allowed.stderr) if "declares model" in w]
    assert warning.endswith("read as qwen3-235b-a22b's routing (--allow-model-mismatch)")


# -- 3. report and compare's page -------------------------------------------------------------


@pytest.fixture(scope="module")
def sglang_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """EPLB on the bundled synthetic trace, planned and judged as SGLang decode."""
    return _planned(tmp_path_factory, "sglang", f"placer plan {SMALL} -m gpt-oss-20b -t"
                    " dgx-h100 -r 8 --solver eplb --engine sglang")


def test_3_report_judges_as_the_plans_record(sglang_plan: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    ran = _placer(f"placer report {SMALL} -p {sglang_plan} -o report.html -q", tmp_path)
    assert ran.returncode == 0, ran.stderr
    judged = "judged as    sglang decode, 128 tokens per GPU (sglang dispatch, low_latency"
    assert judged in ran.stdout + ran.stderr
    assert f"as {sglang_plan} records" in ran.stdout + ran.stderr
    assert "sglang decode" in (tmp_path / "report.html").read_text(encoding="utf-8")


def test_3_compare_page_has_the_recommendation_and_the_warnings(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    ran = _placer(f"placer compare {SMALL} -m gpt-oss-20b -t dgx-h100 -r 0,8 -s eplb"
                  " --report compare.html -q", tmp_path)
    assert ran.returncode == 0, ran.stderr
    page = (tmp_path / "compare.html").read_text(encoding="utf-8")
    [recommended] = [line for line in ran.stdout.splitlines()
                     if line.startswith("recommended:")]
    assert recommended.split(" — ")[0] in page
    for warning in _messages(ran.stderr):
        assert warning in page.replace("&#x27;", "'")


# -- 4. replay's policy flags -----------------------------------------------------------------


def test_4_replay_p_eplb_gives_a_hint_whose_example_runs(tmp_path: Path) -> None:
    ran = _placer(f"{REPLAY} -P eplb", tmp_path)
    assert ran.returncode == 2, ran.stderr
    assert _messages(ran.stderr, "error") == [
        "error: --rebalance: policy 'eplb' needs interval"]
    [hint] = _messages(ran.stderr, "hint")
    example = re.search(r"e\.g\. (\S+)", hint)
    assert example is not None, hint
    again = _placer(f"{REPLAY} -P {example[1]} -q", tmp_path)
    assert again.returncode == 0, again.stderr
    assert example[1] in again.stdout


def test_4_replay_policy_sglang_points_to_dispatch(tmp_path: Path) -> None:
    ran = _placer(f"{REPLAY} --policy sglang", tmp_path)
    assert ran.returncode == 2, ran.stderr
    [error] = _messages(ran.stderr, "error")
    assert error.startswith("error: --policy: no such option: the dispatch rule is --dispatch")
    assert _messages(ran.stderr, "hint") == ["hint: use --dispatch sglang"]
    again = _placer(f"{REPLAY} -P static:default --dispatch sglang -q", tmp_path)
    assert again.returncode == 0, again.stderr
    assert "(sglang dispatch" in again.stdout


# -- 5. what a replay concludes ---------------------------------------------------------------


def test_5_the_replay_says_what_won_and_how_to_run_only_that(tmp_path: Path) -> None:
    """The tour's replay: a static placement wins; no engine's EPLB flags are printed (only
    how to turn online EPLB off), the online policies started from the default layout,
    and the replay is too short for a rebalance to pay back."""
    ran = _placer(f"{REPLAY} -P static:default -P eplb:window=16,interval=16,async"
                  " -P placer:window=16,interval=16,async,decide-ms=10 -P oracle:interval=16 -q",
                  tmp_path)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert "recommended: a static placement (no online rebalancing) (static:default)" in lines
    assert "--enable-eplb --eplb-config" not in ran.stdout
    assert any(line.startswith("to run it: serve the placement with online EPLB off")
               for line in lines)
    header = next(line for line in lines if line.startswith("policy "))
    assert header.rstrip().endswith("started from")
    eplb = next(line for line in lines if line.startswith("eplb:window=16"))
    assert eplb.rstrip().endswith("default")
    assert any(line.startswith("note: this replay (128 steps") and "too short for any"
               " rebalance to pay back" in line for line in lines)


def test_5_flags_are_printed_for_the_recommended_engine_setting_alone(tmp_path: Path) -> None:
    ran = _placer(f"{REPLAY} -P eplb:interval=100 -P eplb:interval=64 -q", tmp_path)
    assert ran.returncode == 0, ran.stderr
    [recommended] = [line for line in ran.stdout.splitlines()
                     if line.startswith("recommended:")]
    assert recommended.startswith("recommended: the engine's online EPLB (eplb:interval=")
    best = recommended.rsplit("(", 1)[1].rstrip(")")
    flags = [line for line in ran.stdout.splitlines() if line.startswith("  ")
             and ("vLLM" in line or "SGLang" in line or "TensorRT-LLM" in line)]
    assert flags and all(f"({best})" in line for line in flags), flags


# -- 6. the tour's warnings -------------------------------------------------------------------

README = (REPO / "README.md").read_text(encoding="utf-8")
TOUR = [e.command for e in doc_examples(README[README.index("## A tour"):
                                              README.index("## Use it with your engine")])]
#: What the tour's plans may warn about: the data is synthetic; EPLB's plan puts experts
#: twice on a GPU (once, by the plan).
WORTH_ACTING = ("the trace declares itself synthetic", "replicas of expert")


def test_6_the_tours_plans_warn_only_what_is_worth_acting_on(tmp_path: Path) -> None:
    """The tour's plans and evaluation of the bundled synthetic trace (4 source ranks, on
    8 GPUs): no warning about ranks; EPLB's duplicates said by its plan, not again when
    evaluate reads the file back."""
    workdir = readme_workdir(tmp_path / "tour")
    (workdir / "out" / "tour").mkdir(parents=True)
    commands = [c for c in TOUR if "synthetic-small" in c and "my-cluster" not in c]
    assert len(commands) >= 5
    said = {}
    for command in commands:
        ran = _placer(command, workdir)
        assert ran.returncode == 0, f"{command}\n{ran.stderr}"
        said[command] = _messages(ran.stderr)
        for warning in said[command]:
            assert any(w in warning for w in WORTH_ACTING), f"{command}\n{warning}"
    eplb = next(c for c in commands if "--solver eplb" in c)
    evaluate = next(c for c in commands if c.startswith("placer evaluate"))
    assert "out/tour/eplb.json" in evaluate
    assert sum("replicas of expert" in w for w in said[eplb]) == 1
    assert not any("replicas of expert" in w for c in commands if c != eplb for w in said[c])


@pytest.mark.parametrize("command", ["plan", "evaluate", "replay"])
def test_6_a_trace_on_fewer_ranks_is_dealt_over_the_cluster_with_a_note(command, tmp_path):
    """The bundled trace was made on 4 source ranks: on 8 GPUs its tokens are dealt over
    all 8, said where each command says how it judged, not warned about."""
    note = "tokens dealt over the 8 GPUs, not the trace's 4 source ranks"
    plan = f"placer plan {SMALL} -m gpt-oss-20b -t dgx-h100 -r 8 --solver eplb -o p.json -q"
    line = {"plan": plan, "evaluate": f"placer evaluate {SMALL} -p p.json -q",
            "replay": f"placer replay {SMALL} -m gpt-oss-20b -t dgx-h100 -r 8"
                      " -P static:default -q"}[command]
    if command == "evaluate":
        assert _placer(plan, tmp_path).returncode == 0
    ran = _placer(line, tmp_path)
    assert ran.returncode == 0, ran.stderr
    said = {"plan": [x for x in ran.stdout.splitlines() if x.startswith("judged on")],
            "evaluate": [x for x in ran.stdout.splitlines() if x.startswith("held-out:")],
            "replay": [x for x in ran.stdout.splitlines() if x.startswith("note: tokens")]}
    [where] = said[command]
    assert note in where
    assert not any("source rank" in w for w in _messages(ran.stderr))


# -- 7. names and suggestions -----------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_help() -> dict[str, str]:
    """``placer plan -h``'s ``-e``: each engine and the dispatch it says it judges under."""
    ran = console.run("placer plan -h", REPO)
    text = " ".join(ran.stdout.split())
    found = re.search(r"-e, --engine ENGINE Serving engine \(([^)]*)\).*?under \(([^)]*)\)", text)
    assert found is not None, text
    pairs = dict(p.split(": ") for p in found[2].split("; "))
    assert list(pairs) == found[1].split(", ")
    return pairs


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_7_engine_help_names_what_the_output_says(engine: str, engine_help: dict[str, str],
                                                  tmp_path: Path) -> None:
    ran = _placer(f"placer plan {SMALL} -m gpt-oss-20b -t dgx-h100 -r 8 --solver eplb"
                  f" -e {engine} -o plan.json", tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert (f"judged as    {engine} decode, 128 tokens per GPU ({engine_help[engine]} dispatch"
            in ran.stdout)


@pytest.mark.parametrize(("trace", "model", "topology"), [
    (QWEN3, "qwen3-30b-a3b", "2x-dgx-h100"), (DSV3, "deepseek-v3", "4x-dgx-h100"),
])
def test_7_a_redundant_count_hint_suggests_what_the_memory_holds(trace: Path, model: str,
                                                                 topology: str,
                                                                 tmp_path: Path) -> None:
    ran = _placer(f"placer plan {trace} -m {model} -t {topology} -r 1000 -o plan.json",
                  tmp_path)
    assert ran.returncode == 2, ran.stderr
    [hint] = _messages(ran.stderr, "hint")
    suggested = [int(n) for n in re.search(r"--redundant ([\d ]+(?:or \d+)?)", hint)[1]
                 .replace("or", " ").split()]
    assert suggested
    from placer.model import load_model
    from placer.planning.build import ProblemSpec, build_problem
    from placer.topology import load_topology
    from placer.traces import read_routing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = read_routing(trace).stats
    spec = ProblemSpec(model=load_model(model), topology=load_topology(topology))
    for value in suggested:  # each passes the memory check, and splits evenly
        problem = build_problem(stats, replace(spec, redundant=value))
        assert problem.slots_per_gpu * problem.num_gpus == stats.num_experts + value


@pytest.mark.parametrize(("trace", "model", "topology", "redundant"), [
    (DSV3, "deepseek-v3", "4x-dgx-h100", 1000),   # memory holds 14 slots: 192 at most
    (DSV3, "deepseek-v3", "4x-dgx-h100", 992),    # splits evenly, overflows the memory
    (DSV3, "deepseek-v3", "4x-dgx-h100", 100),
    (DSV3, "deepseek-v3", "4x-dgx-h100", 7),
    (QWEN3, "qwen3-30b-a3b", "2x-dgx-h100", 1000),
    (QWEN3, "qwen3-30b-a3b", "2x-dgx-h100", 5),
    (QWEN3, "qwen3-30b-a3b", "dgx-h100", 3000),   # past one replica of each expert a GPU
])
def test_7_every_redundant_count_a_hint_suggests_plans(trace: Path, model: str, topology: str,
                                                       redundant: int) -> None:
    """``-r 1000`` on 4 DGX H100 once suggested 992 or 1024 where the memory holds at most
    192: each value a hint names must itself build a problem."""
    from placer.errors import PlacerError
    from placer.model import load_model
    from placer.planning.build import ProblemSpec, build_problem
    from placer.topology import load_topology
    from placer.traces import read_routing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = read_routing(trace).stats
    spec = ProblemSpec(model=load_model(model), topology=load_topology(topology))
    with pytest.raises(PlacerError) as info:
        build_problem(stats, replace(spec, redundant=redundant))
    hint = info.value.hint or ""
    suggested = [int(n) for n in re.findall(r"`redundant` (\d+(?: or \d+)*)", hint)
                 for n in n.split(" or ")]
    assert suggested, f"no value suggested: {info.value} / {hint}"
    for value in suggested:
        problem = build_problem(stats, replace(spec, redundant=value))
        assert problem.slots_per_gpu * problem.num_gpus == stats.num_experts + value


def test_7_a_mistyped_topology_suggests_the_preset(tmp_path: Path) -> None:
    ran = _placer(f"placer plan {QWEN3} -m qwen3-30b-a3b -t 4x-h100 -o plan.json", tmp_path)
    assert ran.returncode in (1, 2), ran.stderr
    assert _messages(ran.stderr, "error") == [
        "error: topology: unknown topology '4x-h100': not a preset and no such file"]
    [hint] = _messages(ran.stderr, "hint")
    assert hint.startswith("hint: did you mean '4x-dgx-h100'?")


# -- 8. synth's progress in a log -------------------------------------------------------------


def test_8_synth_says_its_progress_when_stderr_is_not_a_terminal(monkeypatch, tmp_path):
    """A batch job's log (stderr a file, not a terminal) gets a progress line every
    ``PROGRESS_LINE_S`` seconds (here every update) and the last one."""
    from placer.cli import stats_cmd

    monkeypatch.setattr(stats_cmd, "PROGRESS_LINE_S", 0.0)
    ran = _placer("placer synth trace.npz --experts 16 --top-k 2 --layers 2 --tokens 300000",
                  tmp_path)
    assert ran.returncode == 0, ran.stderr
    progress = [line for line in ran.stderr.splitlines() if line.startswith("synth: ")]
    assert len(progress) >= 2, ran.stderr
    assert progress[-1] == "synth: 300,000 / 300,000 tokens (100%)"
    assert "\r" not in ran.stderr


# -- 9. the tour's files, and the presets it names --------------------------------------------


def test_9_the_tour_writes_only_under_out() -> None:
    writes = [path for command in TOUR for pair in WRITES.findall(command)
              for path in pair if path]
    assert writes and all(path.startswith("out/") for path in writes), writes
    folders = [c.split()[-1] for c in TOUR if c.startswith("mkdir")]
    assert folders and all(f.startswith("out/") for f in folders), folders


def test_9_the_two_nvl72_racks_preset_exists(tmp_path: Path) -> None:
    ran = _placer("placer topology show 2x-gb200-nvl72", tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("2x-gb200-nvl72: 144 GPUs in 2 nodes")


# -- 10. a plan with the redundancy a hint suggests, in bounded time and memory ---------------


def _limit_memory(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


@pytest.mark.slow
def test_10_a_plan_with_the_redundancy_placer_suggests_finishes_in_bounded_memory(
        tmp_path: Path) -> None:
    """``-r 992`` (what placer's own hint suggests for ``-r 1000`` on 16 GPUs) once grew
    the floor's knapsack to replicas squared (7.5 GiB for one array): it must finish
    within 60 s and 2 GB of address space, with the floor printed."""
    out = tmp_path / "plan.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "placer.cli.main", "plan", str(QWEN3), "-m", "qwen3-30b-a3b",
         "-t", "2x-dgx-h100", "-r", "992", "--solver", "eplb", "-o", str(out), "-q"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        preexec_fn=_limit_memory(2 << 30))
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.exists()
    assert "floor: no placement with 70 slots per GPU" in done.stdout
    # the target is 60 s on a quiet 2-core machine (36-44 s measured); a test shares the
    # cores with the rest of the slow tier, so it allows twice that before calling it a hang
    assert took < 120, f"{took:.1f} s"

"""An output into a folder that does not exist is refused before any work.

``placer plan ... -o missing/dir/x.json`` used to plan for 44 s and then create the folder
quietly: a mistyped path became a new folder.  Every command that writes refuses such a
path up front (exit 2), naming the option and saying how to make the folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.cli.main import app

runner = CliRunner()

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "traces" / "synthetic-small.jsonl.gz"
TIMINGS = ROOT / "bench" / "data" / "deepep_v1.csv"


#: The bundled trace's model: 4 MoE layers of 32 experts, top-4 (gpt-oss-20b's experts).
MODEL = """name: synthetic
num_hidden_layers: 4
moe_layer_ids: [0, 1, 2, 3]
num_experts: 32
top_k: 4
hidden_size: 2880
moe_intermediate_size: 2880
non_expert_params: 1000000000
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bundled trace's model, an EPLB placement of it on one DGX H100, and the
    placement as DeepSeek EPLB's arrays."""
    folder = tmp_path_factory.mktemp("inputs")
    model, plan, engine = folder / "model.yaml", folder / "plan.json", folder / "plan.npz"
    model.write_text(MODEL)
    done = runner.invoke(app, ["plan", str(BUNDLED), "-m", str(model), "-t", "dgx-h100",
                               "-s", "eplb", "-o", str(plan), "-q"])
    assert done.exit_code == 0, done.stderr
    done = runner.invoke(app, ["export", str(plan), "-f", "eplb", "-m", str(model), "-o",
                               str(engine)])
    assert done.exit_code == 0, done.stderr
    return {"model": model, "plan": plan, "engine": engine}


#: Each writing command (and its output option), the file it would write in the missing
#: folder, and its command line (``{missing}``: that file's path).
COMMANDS = {
    "plan -o": ("plan.json", ["plan", "{trace}", "-m", "{model}", "-t", "dgx-h100", "-o",
                              "{missing}"]),
    "plan --export": ("plan.npz", ["plan", "{trace}", "-m", "{model}", "-t", "dgx-h100",
                                   "-o", "{here}.json", "--export", "eplb:{missing}"]),
    "compare --report": ("compare.html", ["compare", "{trace}", "-m", "{model}", "-t",
                                          "dgx-h100", "--report", "{missing}"]),
    "compare --png-dir": ("pictures", ["compare", "{trace}", "-m", "{model}", "-t",
                                       "dgx-h100", "--png-dir", "{missing}"]),
    "report -o": ("report.html", ["report", "{trace}", "-p", "{plan}", "-m", "{model}", "-o",
                                  "{missing}"]),
    "report --png-dir": ("pictures", ["report", "{trace}", "-p", "{plan}", "-m", "{model}",
                                      "-o", "{here}.html",
                                      "--png-dir", "{missing}"]),
    "export -o": ("plan.npz", ["export", "{plan}", "-f", "eplb", "-m", "{model}", "-o",
                               "{missing}"]),
    "import -o": ("plan.json", ["import", "{engine}", "-f", "eplb", "-m", "{model}", "-t",
                                "dgx-h100", "-o", "{missing}"]),
    "calibrate -o": ("cluster.yaml", ["calibrate", str(TIMINGS), "--topology", "dgx-h800",
                                      "-o", "{missing}"]),
    "replay --report": ("replay.html", ["replay", "{trace}", "-m", "{model}", "-t", "dgx-h100",
                                        "--report", "{missing}"]),
    "replay --png-dir": ("pictures", ["replay", "{trace}", "-m", "{model}", "-t", "dgx-h100",
                                      "--png-dir", "{missing}"]),
    "synth OUTPUT": ("trace.npz", ["synth", "{missing}", "--model", "deepseek-v3",
                                   "--tokens", "100"]),
    "synth OUTPUT jsonl": ("trace.jsonl", ["synth", "{missing}", "--model", "deepseek-v3",
                                           "--tokens", "100"]),
    "synth OUTPUT jsonl.gz": ("trace.jsonl.gz", ["synth", "{missing}", "--model",
                                                 "deepseek-v3", "--tokens", "100"]),
}

#: Options that name a file or folder a command writes; every one is in COMMANDS.
WRITING = {"output", "report", "png_dir", "export"}


def test_every_option_that_writes_a_file_is_walked() -> None:
    """A new command or option that writes must join COMMANDS, so that its missing folder
    is checked too."""
    import typer.main

    root = typer.main.get_command(app)
    walked = {(name.split()[0], name.split()[1]) for name in COMMANDS}
    found = set()
    for command_name, command in root.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            if param.name not in WRITING:
                continue
            if param.param_type_name == "argument":
                found.add((command_name, param.metavar or param.name.upper()))
            else:
                flags = sorted(param.opts, key=len)
                walked_flag = next((f for f in flags if (command_name, f) in walked), None)
                found.add((command_name, walked_flag or flags[-1]))
    assert found, "no writing options found: the walk is broken"
    assert found <= walked, f"not walked: {sorted(found - walked)}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_output_in_a_missing_folder_is_refused_up_front(
    name: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-folder" / "deeper"
    filename, command = COMMANDS[name]
    values = {"trace": str(BUNDLED), "missing": str(missing / filename),
              "here": str(tmp_path / "written"), **{k: str(v) for k, v in inputs.items()}}
    args = [a.format(**values) for a in command]
    result = runner.invoke(app, args)
    option = "--output" if name.endswith(" -o") else name.split()[1]
    # --png-dir names the folder it fills: that folder must exist, as any output's must
    absent = missing / filename if option == "--png-dir" else missing
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert f"error: {option}: folder {absent} does not exist" in result.stderr
    assert f"hint: create it first (mkdir -p {absent})" in result.stderr
    assert not (tmp_path / "no-such-folder").exists()
    assert result.stdout == ""  # refused before any work: nothing planned, judged or fitted


def test_the_check_comes_before_reading_the_trace(tmp_path: Path) -> None:
    """A plan whose trace is also wrong says the folder first: nothing was read."""
    result = runner.invoke(app, ["plan", str(tmp_path / "missing-trace.npz"), "-o",
                                 str(tmp_path / "nope" / "plan.json")])
    assert result.exit_code == 2
    assert "folder" in result.stderr and "missing-trace" not in result.stderr


def test_a_folder_that_exists_is_written_in(inputs: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "plan.eplb.npz"
    result = runner.invoke(app, ["export", str(inputs["plan"]), "-f", "eplb", "-m",
                                 str(inputs["model"]), "-o",
                                 str(target)])
    assert result.exit_code == 0, result.stderr
    assert target.exists()

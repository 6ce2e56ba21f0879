"""bench/replay.py's drifting traces: the same command at every skew preset but the
preset, and each generated trace's measured skew in its preset's range (tiny sizes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bench package
import bench.replay as replay
from bench import skews


def test_every_skew_runs_the_same_command_but_its_preset(tmp_path: Path) -> None:
    for key in replay.CASES:
        commands = {s: replay.synth_command(key, s, tmp_path / "t.npz") for s in skews.SKEWS}
        assert "--zipf" not in commands["real"]
        for skew, command in commands.items():
            at = command.index("--skew")
            assert command[at + 1] == skew
            assert command[:at] + command[at + 2:] == (
                commands["real"][:at] + commands["real"][at + 2:])
            assert command[command.index("--seed") + 1] == "1"


def test_the_policies_pair_eplb_and_placer_at_each_cadence() -> None:
    pairs = replay._pairs()
    assert len(pairs) == len(replay.INTERVALS) * len(replay.WINDOWS)
    for eplb, placer in pairs:
        assert replay.parse_cadence(eplb) == replay.parse_cadence(placer)


@pytest.mark.parametrize("skew", skews.SKEWS)
def test_a_tiny_drifting_trace_has_its_presets_skew(tmp_path: Path, skew: str) -> None:
    path = tmp_path / f"qwen3-{skew}.npz"
    done = subprocess.run(replay.synth_command("qwen3", skew, path, steps=4),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    path.with_suffix(".json").write_text(done.stdout)
    measured = replay.trace_skew(path)
    assert measured.cls == skew
    assert skews.in_preset_range(measured, skew)
    # the record beside the trace says what reading the trace says
    path.with_suffix(".json").unlink()
    again = replay.trace_skew(path)
    assert again.gini == pytest.approx(measured.gini, abs=1e-6)
    assert again.cls == skew

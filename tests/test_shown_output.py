"""The tour's comparison of shown and printed output (``shown_output``), on hand-made
outputs: what it accepts, and that it fails where the README would have drifted."""

from __future__ import annotations

from readme_fixtures import doc_examples
from shown_output import Mode, differences, searched

PLAN = """\
solver       eplb (HEURISTIC, 0.01 s)
estimated time, µs              eplb       floor
step p99                       419.5       249.2
"""
WARNING = "warning: the trace declares itself synthetic (synthetic: true)"


def test_the_same_output_agrees() -> None:
    assert differences([*PLAN.splitlines(), WARNING], PLAN, WARNING + "\n", Mode.EXACT) == []


def test_a_figure_that_drifted_fails() -> None:
    shown = PLAN.replace("419.5", "421.2").splitlines()
    problems = differences([*shown, WARNING], PLAN, WARNING + "\n", Mode.EXACT)
    assert len(problems) == 1 and "421.2" in problems[0]


def test_a_warning_the_page_does_not_show_fails() -> None:
    problems = differences(PLAN.splitlines(), PLAN, WARNING + "\n", Mode.EXACT)
    assert len(problems) == 1 and "stderr" in problems[0] and WARNING in problems[0]


def test_a_warning_no_longer_printed_fails() -> None:
    problems = differences([*PLAN.splitlines(), WARNING], PLAN, "", Mode.EXACT)
    assert len(problems) == 1 and "stderr" in problems[0]


def test_progress_on_stderr_is_not_compared() -> None:
    stderr = f"[1/4] layers planned, eta 1 s\njudge: done in 0.3 s\n{WARNING}\n"
    assert differences([*PLAN.splitlines(), WARNING], PLAN, stderr, Mode.EXACT) == []


def test_printed_lines_left_out_need_a_gap_mark() -> None:
    shown = PLAN.splitlines()[:2]
    assert len(differences(shown, PLAN, "", Mode.EXACT)) == 1
    assert differences([*shown, "..."], PLAN, "", Mode.EXACT) == []
    assert len(differences(PLAN.splitlines()[1:], PLAN, "", Mode.EXACT)) == 1
    assert differences(["...", *PLAN.splitlines()[1:]], PLAN, "", Mode.EXACT) == []
    middle = [PLAN.splitlines()[0], "...", PLAN.splitlines()[2]]
    assert differences(middle, PLAN, "", Mode.EXACT) == []


def test_lines_out_of_order_fail() -> None:
    lines = PLAN.splitlines()
    assert len(differences([lines[2], "...", lines[0], "..."], PLAN, "", Mode.EXACT)) == 1


def test_durations_and_spacing_are_not_compared() -> None:
    printed = PLAN.replace("0.01 s", "3.19 s").replace("419.5       249.2", "419.5  249.2")
    printed += "solve time, s                   3.19        0.01\n"
    shown = [*PLAN.splitlines(), "solve time, s                   0.88        0.00"]
    assert differences(shown, printed, "", Mode.EXACT) == []
    table = "policy   p99 µs  decide s\nstatic    966.3      0.00\n"
    assert differences(table.replace("0.00", "0.01").splitlines(), table, "", Mode.EXACT) == []
    assert len(differences(table.replace("966.3", "966.4").splitlines(), table, "",
                           Mode.EXACT)) == 1


def test_a_search_s_figures_are_compared_within_the_tolerance() -> None:
    printed = "solver       cpsat (FEASIBLE, 21.63 s, gap 2.59%)\nstep p99    7134.7   8192.2\n"
    near = "solver       cpsat (FEASIBLE, 17.04 s, gap 2.44%)\nstep p99    7149.0   8192.2"
    assert differences(near.splitlines(), printed, "", Mode.TOLERANT) == []
    far = near.replace("7149.0", "6000.0")
    assert len(differences(far.splitlines(), printed, "", Mode.TOLERANT)) == 1
    assert len(differences(far.splitlines(), printed, "", Mode.EXACT)) == 1
    signs = "vs current  -6.47%"
    assert len(differences([signs], "vs current  +0.00%\n", "", Mode.TOLERANT)) == 1


def test_masked_figures_still_compare_words() -> None:
    printed = "verdict: cpsat is 1.6% slower than eplb\nsolver cpsat (FALLBACK, 0.9 s)\n"
    assert differences(["verdict: cpsat is 9.9% slower than eplb", "solver cpsat (FEASIBLE,"
                        " 12 s)"], printed, "", Mode.MASKED) == []
    assert len(differences(["verdict: cpsat is 1.6% faster than eplb", "..."], printed, "",
                           Mode.MASKED)) == 1


def test_what_a_search_decides_is_found_through_the_files() -> None:
    page = """\
```console
$ placer plan t.npz -t dgx-h100 --solver eplb -o out/eplb.json
$ placer plan t.npz -t dgx-h100 -o out/cpsat.json --export sglang:out/cpsat.sglang.json
$ placer evaluate t.npz -p out/eplb.json
$ placer evaluate t.npz -p out/eplb.json -p out/cpsat.json
$ placer export out/cpsat.json --format vllm -o out/cpsat.vllm.json
$ placer import out/cpsat.vllm.json --format vllm -o out/back.json
$ placer stats t.npz
```
"""
    examples = doc_examples(page)
    found = searched(examples)
    assert [e.line in found for e in examples] == [False, True, False, True, True, True,
                                                   False]

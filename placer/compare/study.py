"""Scenario files (YAML) as a :class:`Study`: a comparison written down.

The schema is :func:`study_from_yaml`'s (docs/compare.md); the comparison itself is
:mod:`placer.compare`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placer.compare.scenarios import CompareSettings, Scenario
from placer.compare.sweep import Sweep, parse_counts, sweep_scenarios
from placer.errors import PlacerError, PlacerWarning, UsageError
from placer.regime import ENGINES, MODES, POLICIES, WORKLOADS


@dataclass(frozen=True)
class Grid:
    """The product of topologies, redundancies and solvers a study sweeps.

    Which redundancies a topology runs depends on its GPUs (and, for ``auto``, its
    memory), so the grid becomes scenarios once the model is known (:func:`resolve_study`).

    Attributes
    ----------
    topologies: preset names or YAML paths.
    sweep: the redundancies to try (:class:`placer.compare.sweep.Sweep`).
    solvers: solver names.
    """

    topologies: tuple[str, ...]
    sweep: Sweep
    solvers: tuple[str, ...]


@dataclass(frozen=True)
class Study:
    """A repeatable comparison: what to read, what to compare, and how.

    Attributes
    ----------
    scenarios: in order: the grid's (once resolved), then the listed ones.
    settings: shared settings.
    trace: the routing trace path(s), when the study names them.
    extras: free-form values kept for the report (source file name).
    grid: the product still to expand into scenarios (:func:`resolve_study`), placed
        before ``scenarios``; None once resolved or when there is none.
    notes: what the grid's expansion skipped on which topology, and why.
    """

    scenarios: tuple[Scenario, ...]
    settings: CompareSettings
    trace: tuple[str, ...] = ()
    extras: dict[str, Any] = field(default_factory=dict)
    grid: Grid | None = None
    notes: tuple[str, ...] = ()


def resolve_study(study: Study) -> Study:
    """``study`` with its grid expanded for its model
    (:func:`placer.compare.sweep.sweep_scenarios`): the grid's scenarios first, then the
    listed ones; ``notes`` say what was skipped.

    Raises
    ------
    UsageError: no model named; or every value of the sweep was skipped on every topology
        and no scenario is listed.
    """
    from dataclasses import replace

    from placer.model import load_model

    grid = study.grid
    if grid is None:
        return study
    if not study.settings.model:
        raise UsageError("no model to plan for", where="--model",
                         hint="give --model NAME (see `placer model list`) or 'model:' in the"
                              " scenario file")
    settings = study.settings
    scenarios, notes = sweep_scenarios(
        grid.topologies, grid.sweep, grid.solvers, load_model(settings.model),
        dtype=settings.dtype, kv_reserve_gb=settings.kv_reserve_gb)
    if not scenarios and not study.scenarios:
        raise UsageError(
            f"no scenario left to compare: {'; '.join(notes)}", where=grid.sweep.option,
            hint="give values valid on the GPUs, or let --slots-per-gpu or --redundant auto"
                 " give each topology values it can run")
    return replace(study, scenarios=scenarios + study.scenarios, grid=None,
                   notes=study.notes + notes)


#: The key ``dispatch`` had before: read with a warning.
OLD_DISPATCH_KEY = "policy"
#: Keys of a scenario file, in the order docs/compare.md documents them.
STUDY_KEYS = ("trace", "model", "dtype", "topologies", "redundant", "slots_per_gpu",
              "solvers", "scenarios", "engine", "workload", "tokens_per_gpu", "dispatch", "mode",
              "seed", "kv_reserve_gb", "time_limit_s", "layer_time_limit_s", "holdout",
              "p99_target_us", "p99_slack_pct")


_PATH_SUFFIXES = (".yaml", ".yml", ".json", ".jsonl", ".gz", ".npz", ".csv", ".npy")


def study_from_yaml(text: str, source: str = "<scenarios>", base_dir: Path | None = None) -> Study:
    """Parse a scenario file (YAML) into a :class:`Study`.

    The schema (every key optional but at least one scenario; ``model`` and
    ``trace`` may come from the command line instead)::

        trace: traces/run.jsonl          # or a list; relative to the file's folder
        model: deepseek-v3               # preset name or YAML path
        dtype: fp8
        topologies: [2x-dgx-h100, 1x-dgx-h200]   # x redundant x solvers
        redundant: [0, 16, 32]           # or "0..64", or auto; default: the fewest
        slots_per_gpu: [8, 9, 10]        # or "8..12"; instead of redundant
        solvers: [eplb, cpsat]           # default [eplb]
        scenarios:                       # extra scenarios, after the product
          - {name: NVL72, topology: gb200-nvl72, redundant: 32, solver: cpsat}
        engine: sglang                   # the regime, as every command takes it:
        workload: decode                 #   default vllm decode, 128 tokens per GPU
        tokens_per_gpu: 128
        dispatch: sglang                 # overrides: vllm_hash | trtllm_block | round_robin |
        mode: low_latency                #   sglang | local_first | random; normal |
                                         #   low_latency | low_latency_rdma
        seed: 0
        kv_reserve_gb: 20
        time_limit_s: 30
        layer_time_limit_s: 5
        holdout: true
        p99_target_us: 5000              # the recommendation's latency target
        p99_slack_pct: 10                # without a target: within 10% of the lowest p99

    The product (``topologies`` x ``redundant`` or ``slots_per_gpu`` x ``solvers``) is
    :attr:`Study.grid`: each topology runs the values valid on its GPUs once
    :func:`resolve_study` knows the model.  Unknown keys, wrong types and unknown choices
    raise UsageError with ``where="<file>:<line>: <yaml path>"``. Paths (``trace``,
    topology and model files) are resolved against ``base_dir`` when they exist there.
    """
    from placer.io.yaml_schema import parse_yaml

    doc = parse_yaml(text, source, UsageError)
    root = doc.root()
    base = base_dir or Path(".")

    def resolve(value: str) -> str:
        candidate = base / value
        is_path = "/" in value or value.endswith(_PATH_SUFFIXES)
        return str(candidate) if is_path and candidate.exists() else value

    trace: tuple[str, ...] = ()
    raw_trace = root.raw("trace", None)
    if isinstance(raw_trace, list):
        trace = tuple(resolve(_yaml_string(root, p, v, "trace")) for p, v in root.items("trace"))
    elif raw_trace is not None:
        trace = (resolve(root.string("trace")),)
    settings_kwargs = _yaml_settings(root, resolve)
    topologies = tuple(resolve(_yaml_string(root, p, v, "topology"))
                       for p, v in root.items("topologies", []))
    sweep = _yaml_sweep(root)
    solvers = tuple(_yaml_string(root, p, v, "solver") for p, v in root.items("solvers", []))
    grid = Grid(topologies, sweep, solvers or ("eplb",)) if topologies else None
    scenarios = _yaml_scenarios(doc, root, resolve)
    root.done()
    if not scenarios and grid is None:
        raise doc.fail("", "the scenario file names no scenario",
                       hint="give 'topologies' (with 'redundant' and 'solvers') or 'scenarios'")
    return Study(tuple(scenarios), CompareSettings(**settings_kwargs), trace,
                 {"source": source}, grid=grid)


def _yaml_settings(root: Any, resolve: Callable[[str], str]) -> dict[str, Any]:
    """The scenario file's settings, as keyword arguments of :class:`CompareSettings`
    (keys the file leaves out keep their defaults)."""
    model = root.string("model", None)
    settings_kwargs: dict[str, Any] = {"model": resolve(model) if model else ""}
    dtype = root.string("dtype", None)
    if dtype is not None:
        settings_kwargs["dtype"] = dtype
    kv = root.number("kv_reserve_gb", None, strict=False)
    if kv is not None:
        settings_kwargs["kv_reserve_gb"] = kv
    for key in ("time_limit_s", "layer_time_limit_s"):
        limit = root.number(key, None)
        if limit is not None:
            settings_kwargs[key] = limit
    settings_kwargs["seed"] = root.integer("seed", 0, minimum=0)
    settings_kwargs["holdout"] = root.boolean("holdout", True)
    for key, choices in (("engine", ENGINES), ("workload", WORKLOADS), ("mode", MODES)):
        value = root.string(key, None, choices=choices)
        if value is not None:
            settings_kwargs[key] = value
    dispatch = _yaml_dispatch(root)
    if dispatch is not None:
        settings_kwargs["policy"] = dispatch
    tokens = root.integer("tokens_per_gpu", None, minimum=1)
    if tokens is not None:
        settings_kwargs["tokens_per_gpu"] = tokens
    target = root.number("p99_target_us", None)
    if target is not None:
        settings_kwargs["p99_target_us"] = target
    slack = root.number("p99_slack_pct", None, strict=False)
    if slack is not None:
        settings_kwargs["p99_slack_pct"] = slack
    return settings_kwargs


def _yaml_dispatch(root: Any) -> str | None:
    """The ``dispatch`` override, or the old key ``policy`` (as ``--policy`` was), read
    with a warning."""
    value = root.string("dispatch", None, choices=POLICIES)
    if not root.has(OLD_DISPATCH_KEY):
        return value  # type: ignore[no-any-return]
    if value is not None:
        raise root.fail(OLD_DISPATCH_KEY, "'policy' and 'dispatch' are one setting, given twice",
                        hint="keep 'dispatch' (the dispatch rule, as --dispatch)")
    warnings.warn(PlacerWarning(
        f"{root.doc.where(OLD_DISPATCH_KEY)}: the key 'policy' is now 'dispatch' (as the"
        " flag --dispatch); read as such"), stacklevel=2)
    return root.string(OLD_DISPATCH_KEY, None, choices=POLICIES)  # type: ignore[no-any-return]


def _yaml_scenarios(doc: Any, root: Any, resolve: Callable[[str], str]) -> list[Scenario]:
    """The file's explicit ``scenarios`` list, in order."""
    from placer.io.yaml_schema import Section

    scenarios: list[Scenario] = []
    for path, value in root.items("scenarios", []):
        item = Section(doc, value, path)
        scenarios.append(Scenario(
            topology=resolve(item.string("topology")),
            redundant=item.integer("redundant", 0, minimum=0),
            solver=item.string("solver", "eplb"),
            name=item.string("name", ""),
        ))
        item.done()
    return scenarios


def read_study(path: str | Path) -> Study:
    """Read a scenario file; paths inside it are relative to its folder."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError("scenario file not found", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read scenario file: {e}", where=str(path)) from None
    return study_from_yaml(text, str(path), path.parent)


def _yaml_string(section: Any, path: str, value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not str(value):
        raise section.doc.fail(path, f"expected a {what} name, got {value!r}")
    return str(value)


def _yaml_sweep(root: Any) -> Sweep:
    """``redundant`` (a list, a ``"A..B"`` string or ``auto``) or ``slots_per_gpu`` (a list
    or a ``"A..B"`` string); at most one of them."""
    given = [k for k in ("redundant", "slots_per_gpu") if root.raw(k, None) is not None]
    if len(given) == 2:
        raise root.fail("slots_per_gpu", "'redundant' and 'slots_per_gpu' exclude each other",
                        hint="give one: S slots per GPU means R = S x GPUs - experts")
    if not given:
        return Sweep()
    key = given[0]
    kind = "redundant" if key == "redundant" else "slots"
    what = "redundant experts" if kind == "redundant" else "slots per GPU"
    raw = root.raw(key)
    if isinstance(raw, str) and kind == "redundant" and raw.strip().lower() == "auto":
        return Sweep("auto")
    if isinstance(raw, str | int) and not isinstance(raw, bool):
        example = "auto, [0, 16, 32] or '0..64'" if kind == "redundant" else "[8, 9] or '8..12'"
        try:
            return Sweep(kind, parse_counts(str(raw), key, example))
        except PlacerError as e:
            raise root.fail(key, e.message, hint=e.hint) from None
    if not isinstance(raw, list) or not raw:
        raise root.fail(key, f"expected a list of {what}, got {raw!r}")
    values = []
    for path, value in root.items(key):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise root.doc.fail(path, f"expected a number of {what} >= 0, got {value!r}")
        values.append(int(value))
    return Sweep(kind, tuple(values))

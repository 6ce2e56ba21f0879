"""The scenarios to compare and the settings they share.

:class:`Scenario`, :func:`expand_scenarios` and :class:`CompareSettings`; the comparison
itself is :mod:`placer.compare`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placer.errors import UsageError
from placer.evaluate import EvalParams
from placer.evaluate.params import regime_params
from placer.problem import SolveParams
from placer.regime import DEFAULT_ENGINE, DEFAULT_WORKLOAD, Regime

#: Default :attr:`CompareSettings.p99_slack_pct`.
DEFAULT_P99_SLACK_PCT = 10.0


@dataclass(frozen=True)
class Scenario:
    """One deployment to plan and evaluate.

    Attributes
    ----------
    topology: a topology preset name or a YAML path (``placer.topology.load_topology``).
    redundant: ``R``, redundant experts per layer (slots beyond one per expert).
    solver: a registered solver name (``placer.planning.solvers.solver_names()``).
    name: label in tables and pictures; default ``"<topology> R=<R> <solver>"``.
    """

    topology: str
    redundant: int
    solver: str
    name: str = ""

    def __post_init__(self) -> None:
        if self.redundant < 0:
            raise UsageError(
                f"redundant experts must be zero or more, got {self.redundant}",
                where="--redundant",
            )

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return f"{topology_label(self.topology)} R={self.redundant} {self.solver}"


def topology_label(topology: str) -> str:
    """Short name of a topology argument: a preset name as is, a file by its stem."""
    if topology.endswith((".yaml", ".yml")) or "/" in topology:
        return Path(topology).stem
    return topology


def expand_scenarios(
    topologies: Sequence[str], redundant: Sequence[int], solvers: Sequence[str]
) -> tuple[Scenario, ...]:
    """Every (topology, redundancy, solver) combination, topology-major, in the given orders."""
    if not topologies:
        raise UsageError("no topology to compare", where="--topology",
                         hint="give --topology at least once (a preset name or a YAML file)")
    if not redundant:
        raise UsageError("no redundancy level to compare", where="--redundant")
    if not solvers:
        raise UsageError("no solver to compare", where="--solver")
    return tuple(
        Scenario(topology=t, redundant=int(r), solver=s)
        for t in topologies for r in redundant for s in solvers
    )


@dataclass(frozen=True)
class CompareSettings:
    """What every scenario of a study shares.

    Attributes
    ----------
    model: model preset name or YAML path (``placer.model.load_model``); ``""``
        until the command line or the scenario file names one.
    dtype: expert weight dtype (``bf16``, ``fp8``, ``mxfp4``); None = the model's default.
    kv_reserve_gb: GB per GPU kept for the KV cache when sizing slots; None = capacity default.
    time_limit_s: wall seconds for each scenario's whole plan, split over its layers
        (``SolveParams.total_time_limit_s``, as ``placer plan --time-limit``); None = the
        default (``constants.DEFAULT_PLAN_SECONDS``).
    layer_time_limit_s: wall seconds cap of one layer (``SolveParams.time_limit_s``, as
        ``placer plan --layer-time-limit``); None = ``SolveParams`` default.
    holdout: judge placements on held-out windows (True) or on all the data (False).
    engine, workload, tokens_per_gpu, policy, mode, seed: the
        :class:`placer.regime.Regime` every scenario is planned for and judged under
        (``--engine``, ``--workload``, ``--tokens-per-gpu``, the overrides ``--dispatch``
        and ``--mode``, ``--seed``), as ``placer plan`` and ``placer evaluate`` do; None
        = the default (vLLM decode, 128 tokens per GPU).
    p99_target_us: the recommendation's latency target: the fewest GPUs whose estimated
        step p99 is at most this many µs (:func:`placer.compare.recommend.recommend`);
        None = the highest throughput per GPU within ``p99_slack_pct`` of the lowest p99.
    p99_slack_pct: without a target, how far (percent) above the lowest step p99 a
        scenario may be and still be recommended.
    """

    model: str
    dtype: str | None = None
    kv_reserve_gb: float | None = None
    time_limit_s: float | None = None
    layer_time_limit_s: float | None = None
    holdout: bool = True
    engine: str | None = None
    workload: str | None = None
    tokens_per_gpu: int | None = None
    policy: str | None = None
    mode: str | None = None
    seed: int = 0
    p99_target_us: float | None = None
    p99_slack_pct: float = DEFAULT_P99_SLACK_PCT

    @property
    def regime(self) -> Regime:
        """The regime of ``engine``, ``workload``, ``tokens_per_gpu``, ``policy``, ``mode``
        and ``seed`` (defaults filled in)."""
        return Regime(self.engine or DEFAULT_ENGINE, self.workload or DEFAULT_WORKLOAD,
                      self.tokens_per_gpu, self.policy, self.mode, self.seed)

    def eval_params(self, num_gpus: int, windows: tuple[int, int] | None = None, *,
                    num_layers: int = 1, sample: bool = False) -> EvalParams:
        """The evaluator's parameters for a scenario on ``num_gpus`` GPUs: the regime's,
        as every command judges (:func:`placer.evaluate.params.regime_params`)."""
        return regime_params(self.regime, num_gpus, num_layers=num_layers, dtype=self.dtype,
                             windows=windows, sample=sample)

    def __post_init__(self) -> None:
        # what the regime, the evaluator and the solvers check, they check (one place)
        self.eval_params(1)
        self.solve_params()
        if self.kv_reserve_gb is not None and not self.kv_reserve_gb >= 0:
            raise UsageError(f"KV reserve must be zero or more GB, got {self.kv_reserve_gb}",
                             where="--kv-reserve-gb", hint="0 or more, e.g. --kv-reserve-gb 20")
        if self.p99_target_us is not None and not 0 < self.p99_target_us < math.inf:
            raise UsageError(f"expected a positive step p99 target in µs, got"
                             f" {self.p99_target_us}", where="--p99-target-us",
                             hint="for example --p99-target-us 5000")
        if not 0 <= self.p99_slack_pct < math.inf:
            raise UsageError(f"expected a slack of 0 percent or more, got {self.p99_slack_pct}",
                             where="--p99-slack", hint="for example --p99-slack 10 (percent)")

    def solve_params(self) -> SolveParams:
        """The solver parameters every scenario shares: planned for the regime."""
        kwargs: dict[str, Any] = {"seed": self.seed, "regime": self.regime}
        if self.time_limit_s is not None:
            kwargs["total_time_limit_s"] = self.time_limit_s
        if self.layer_time_limit_s is not None:
            kwargs["time_limit_s"] = self.layer_time_limit_s
        return SolveParams(**kwargs)

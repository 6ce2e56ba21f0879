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
from placer.problem import SolveParams
from placer.workload import Workload

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
    policy: dispatch policy the evaluator simulates (``round_robin``, ``sglang``, ``local_first``,
        ``random``; :data:`placer.evaluate.POLICIES`).
    mode: all-to-all mode (``normal`` deduplicates copies per GPU and node; ``low_latency`` not).
    kv_reserve_gb: GB per GPU kept for the KV cache when sizing slots; None = capacity default.
    time_limit_s: wall seconds for each scenario's whole plan, split over its layers
        (``SolveParams.total_time_limit_s``, as ``placer plan --time-limit``); None = the
        default (``constants.DEFAULT_PLAN_SECONDS``).
    layer_time_limit_s: wall seconds cap of one layer (``SolveParams.time_limit_s``, as
        ``placer plan --layer-time-limit``); None = ``SolveParams`` default.
    seed: seed of solvers and of the evaluator's sampling.
    batch_tokens: tokens per evaluated batch; None = evaluator default.
    num_batches: batches the evaluator samples when the trace has no per-token
        routing (aggregated loads); None = evaluator default.
    holdout: judge placements on held-out windows (True) or on all the data (False).
    engine, workload, tokens_per_gpu: the :class:`placer.workload.Workload` to plan for and
        judge under (``--engine``, ``--workload``, ``--tokens-per-gpu``); when any is
        given it sets the dispatch policy, the all-to-all mode and the batch
        (``tokens_per_gpu x G`` of each scenario), and the solvers plan for it
        (``SolveParams.workload``); None for all three: ``policy``, ``mode`` and
        ``batch_tokens`` as given, solvers with their default workload.
    p99_target_us: the recommendation's latency target: the fewest GPUs whose estimated
        step p99 is at most this many µs (:func:`placer.compare.recommend.recommend`);
        None = the highest throughput per GPU within ``p99_slack_pct`` of the lowest p99.
    p99_slack_pct: without a target, how far (percent) above the lowest step p99 a
        scenario may be and still be recommended.
    """

    model: str
    dtype: str | None = None
    policy: str = "round_robin"
    mode: str = "normal"
    kv_reserve_gb: float | None = None
    time_limit_s: float | None = None
    layer_time_limit_s: float | None = None
    seed: int = 0
    batch_tokens: int | None = None
    num_batches: int | None = None
    holdout: bool = True
    engine: str | None = None
    workload: str | None = None
    tokens_per_gpu: int | None = None
    p99_target_us: float | None = None
    p99_slack_pct: float = DEFAULT_P99_SLACK_PCT

    @property
    def target(self) -> Workload | None:
        """The workload of ``engine``/``workload``/``tokens_per_gpu``, or None (none given)."""
        if self.engine is None and self.workload is None and self.tokens_per_gpu is None:
            return None
        return Workload(self.engine or "vllm", self.workload or "decode", self.tokens_per_gpu)

    def eval_params(self, num_gpus: int, windows: tuple[int, int] | None = None) -> EvalParams:
        """The evaluator's parameters for a scenario on ``num_gpus`` GPUs."""
        kwargs: dict[str, Any] = {"policy": self.policy, "mode": self.mode, "seed": self.seed,
                                  "dtype": self.dtype, "windows": windows}
        target = self.target
        if target is not None:
            kwargs.update(policy=target.policy, mode=target.mode,
                          batch_tokens=target.batch_tokens(num_gpus))
        elif self.batch_tokens is not None:
            kwargs["batch_tokens"] = self.batch_tokens
        if self.num_batches is not None:
            kwargs["num_batches"] = self.num_batches
        return EvalParams(**kwargs)

    def __post_init__(self) -> None:
        if self.target is not None and (self.policy != "round_robin" or self.mode != "normal"
                                        or self.batch_tokens is not None):
            raise UsageError(
                "--engine/--workload/--tokens-per-gpu set the dispatch policy, the all-to-all"
                " mode and the batch", where="--engine",
                hint="drop --policy, --mode and --batch-tokens (or 'policy', 'mode',"
                " 'batch_tokens' in the scenario file), or drop the workload",
            )
        # what the evaluator and the solvers check, they check (one place, one message)
        self.eval_params(1)
        self.solve_params()
        if self.kv_reserve_gb is not None and not self.kv_reserve_gb >= 0:
            raise UsageError(f"KV reserve must be zero or more GB, got {self.kv_reserve_gb}",
                             where="--kv-reserve-gb")
        if self.p99_target_us is not None and not 0 < self.p99_target_us < math.inf:
            raise UsageError(f"expected a positive step p99 target in µs, got"
                             f" {self.p99_target_us}", where="--p99-target-us",
                             hint="for example --p99-target-us 5000")
        if not 0 <= self.p99_slack_pct < math.inf:
            raise UsageError(f"expected a slack of 0 percent or more, got {self.p99_slack_pct}",
                             where="--p99-slack", hint="for example --p99-slack 10 (percent)")

    def solve_params(self) -> SolveParams:
        """The solver parameters every scenario shares."""
        kwargs: dict[str, Any] = {"seed": self.seed}
        if self.time_limit_s is not None:
            kwargs["total_time_limit_s"] = self.time_limit_s
        if self.layer_time_limit_s is not None:
            kwargs["time_limit_s"] = self.layer_time_limit_s
        if self.target is not None:
            kwargs["workload"] = self.target
        return SolveParams(**kwargs)

"""What every solver takes and returns: the planning problem, the parameters, the result.

A solver is a function ``(PlacementProblem, SolveParams) -> SolveResult``; the table of
solvers and :func:`placer.planning.solvers.solve` live in
:mod:`placer.planning.solvers.registry` (this module imports no solver).  Solvers are
pure: they neither print nor read files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from placer import constants
from placer.errors import Param, UsageError
from placer.limits import check_allocation
from placer.model.slots import fewest_slots_per_gpu
from placer.placement import Placement
from placer.regime import Regime
from placer.stats import ExpertStats

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.topology import Topology


@dataclass(frozen=True)
class PlacementProblem:
    """What a planner needs to know.

    Attributes
    ----------
    stats: statistics to fit (loads by window, co-activation).
    num_gpus: ``G`` EP ranks.
    slots_per_gpu: ``S``; ``P = G * S`` must be >= the number of experts.
    node_of_gpu: ``[G]`` int64, node index of each GPU (all zeros on one node).
    num_groups: expert groups of the model (DeepSeek-V3: 8), 1 when ungrouped;
        EPLB's hierarchical policy uses it.
    topology: the cluster (``placer.topology.Topology``) when known.
    model: the model (``placer.model.ModelSpec``) when known.
    current: the deployed placement, for migration-aware planning.
    """

    stats: ExpertStats
    num_gpus: int
    slots_per_gpu: int
    node_of_gpu: np.ndarray
    num_groups: int = 1
    topology: Topology | None = None
    model: ModelSpec | None = None
    current: Placement | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_of_gpu", np.asarray(self.node_of_gpu, dtype=np.int64))
        if self.num_gpus <= 0:
            raise UsageError(f"number of GPUs must be positive, got {self.num_gpus}")
        if self.slots_per_gpu <= 0:
            raise UsageError(f"slots per GPU must be positive, got {self.slots_per_gpu}")
        if self.node_of_gpu.shape != (self.num_gpus,):
            raise UsageError(f"node_of_gpu must have {self.num_gpus} entries")
        if self.num_physical < self.stats.num_experts:
            raise UsageError(
                f"{self.num_gpus} GPUs x {self.slots_per_gpu} slots = {self.num_physical} slots"
                f" cannot hold {self.stats.num_experts} experts",
                where=Param("slots_per_gpu"),
                hint=f"use at least {fewest_slots_per_gpu(self.stats.num_experts, self.num_gpus)}"
                     " slots per GPU",
            )
        check_allocation(64 * self.stats.num_layers * self.num_physical,
                         f"{self.stats.num_layers:,} layers of {self.num_physical:,} slots"
                         f" ({self.num_gpus:,} GPUs x {self.slots_per_gpu:,})",
                         "fewer slots: a smaller `redundant` or `slots_per_gpu`")
        if self.slots_per_gpu > self.stats.num_experts:
            raise UsageError(
                f"{self.slots_per_gpu} slots per GPU exceed the {self.stats.num_experts} experts;"
                " a GPU would need two replicas of one expert",
                where=Param("slots_per_gpu"),
                hint=f"use at most {self.stats.num_experts} slots per GPU (`redundant` at most"
                     f" {self.num_gpus * self.stats.num_experts - self.stats.num_experts})",
            )

    def cluster(self) -> tuple[Topology, ModelSpec]:
        """The topology and the model, which timing a placement needs (UsageError when
        either is unknown)."""
        if self.topology is None or self.model is None:
            raise UsageError("estimating times needs the model and the topology",
                             where=Param("model" if self.model is None else "topology"),
                             hint="pass `model` and `topology`")
        return self.topology, self.model

    @property
    def num_physical(self) -> int:
        return self.num_gpus * self.slots_per_gpu

    @property
    def num_redundant(self) -> int:
        return self.num_physical - self.stats.num_experts

    @property
    def num_nodes(self) -> int:
        return int(self.node_of_gpu.max()) + 1


@dataclass(frozen=True)
class SolveParams:
    """What every solver shares; a solver's own knobs are ``options``.

    Each solver documents which of these it reads (the greedy ones read none).

    Attributes
    ----------
    time_limit_s: most search budget of one layer for search-based solvers, reference
        seconds (below).
    total_time_limit_s: the whole plan's budget, reference seconds
        (``constants.DEFAULT_PLAN_SECONDS``), split evenly over the layers (each at most
        ``time_limit_s``); None: only the per-layer budget.  ``cpsat`` counts it as
        deterministic work (CP-SAT's deterministic time plus a fixed cost per step),
        sized so that a quiet 2-core machine planning 2 layers at a time takes about that
        many wall seconds: the same work, hence the same plan, on any machine, with any
        ``jobs`` or backend.
    wall_factor: the wall clock is a safety cap only: a layer's search stops after
        ``wall_factor`` times its budget in wall seconds (``cpsat``: at least 5 s); a plan
        the cap stopped depends on the machine's load and says so (``cpsat``:
        ``details["reproducible"]``, a warning).
    seed: random seed; same inputs and seed give the same placement (unless the wall-clock
        cap stopped the search).
    jobs: layers solved in parallel (processes).
    regime: the engine and batch regime the plan is judged under (the evaluator's
        dispatch policy, all-to-all mode and batch size; :class:`placer.regime.Regime`).
    distinct: no GPU may hold two replicas of one expert (the target engine's file
        cannot say so: vLLM-Ascend); solvers that keep a baseline's layer keep
        ``eplb-valid``'s instead of the reference EPLB's.
    max_moves: re-planning (``problem.current``): at most this many weight moves in all
        (a hard budget; :mod:`placer.placement.migration`); None: no budget.
    max_move_gb: the same budget in GB of expert weights to copy; None: none.
    move_tolerance: re-planning without a budget: the fewest moves whose estimated time
        is within this share of the best re-plan's (0.005 = 0.5%; 0 moves when the
        deployed placement is already there).
    options: the solver's own options: an instance of its options class (``cpsat``:
        :class:`placer.planning.solvers.cpsat.CpsatOptions`), a mapping of option names to
        values or ``KEY=VALUE`` strings, or None for its defaults.  A solver without
        options refuses any (:func:`placer.planning.solvers.solve`).
    progress: called as ``progress(done, total)`` as layers finish (search-based
        solvers); None: silent.
    ray: run the layers on Ray (:class:`placer.parallel.Backend`): ``"local"`` starts a
        local instance, another value is a cluster's address; None: local processes.
    """

    time_limit_s: float = 10.0
    total_time_limit_s: float | None = constants.DEFAULT_PLAN_SECONDS
    wall_factor: float = 10.0
    seed: int = 0
    jobs: int = 1
    regime: Regime = field(default_factory=Regime)
    distinct: bool = False
    max_moves: int | None = None
    max_move_gb: float | None = None
    move_tolerance: float = constants.MOVE_TOLERANCE
    options: Any = None
    progress: Callable[[int, int], None] | None = field(default=None, compare=False,
                                                        repr=False)
    ray: str | None = None

    def __post_init__(self) -> None:
        if self.total_time_limit_s is not None and not self.total_time_limit_s > 0:
            raise UsageError(f"time limit must be positive, got {self.total_time_limit_s}",
                             where=Param("total_time_limit_s"))
        if self.max_moves is not None and self.max_moves < 0:
            raise UsageError(f"expected a move budget >= 0, got {self.max_moves}",
                             where=Param("max_moves"), hint="0 keeps the deployed placement")
        if self.max_move_gb is not None and not self.max_move_gb >= 0:
            raise UsageError(f"expected a move budget >= 0 GB, got {self.max_move_gb}",
                             where=Param("max_move_gb"))
        if not 0 <= self.move_tolerance < 1:
            raise UsageError(f"expected a move tolerance in [0, 1), got {self.move_tolerance}",
                             where=Param("move_tolerance"))
        if self.time_limit_s <= 0:
            raise UsageError(f"time limit must be positive, got {self.time_limit_s}",
                             where=Param("layer_time_limit_s"))
        if self.jobs < 1:
            raise UsageError("jobs must be at least 1", where=Param("jobs"))
        if not self.wall_factor > 0:
            raise UsageError(f"expected a wall factor > 0, got {self.wall_factor}",
                             where=Param("wall_factor"))

    def shared(self) -> SolveParams:
        """These parameters without the solver's own options: for running another solver
        (a hint, a baseline) on the same problem."""
        return replace(self, options=None)


@dataclass(frozen=True)
class SolveResult:
    """A solver's answer.

    Attributes
    ----------
    placement: always a valid placement (a time limit still yields one).
    solver: name of the solver that ran (:func:`placer.planning.solvers.solver_names`).
    status: ``OPTIMAL``, ``FEASIBLE``, ``FALLBACK`` (the baseline was kept) or
        ``HEURISTIC`` (a greedy method with no bound).
    hot_shard: the mean over layers of the hot-shard ratio (the busiest GPU's load over
        the mean GPU load, dimensionless) of ``placement`` on the fitted windows' load
        summed over windows; the same figure for every solver, filled in by
        :func:`placer.planning.solvers.solve`.
    objective: the solver's own objective value, in ``objective_unit``; None when it
        has none.
    objective_unit: what ``objective`` measures (for example ``"tokens, busiest GPU of
        the worst layer"``); required with ``objective``.
    bound: a proven lower bound on ``objective``, or None.
    baseline: what the solver compared its plan against and would have kept (``"eplb"``,
        ``"current"`` for the deployed placement), or None when it compares with nothing.
    replan: with a deployed placement, the move budget and the latency-versus-moves
        frontier (:mod:`placer.placement.migration`); None otherwise.
    seconds: wall time.
    details: per-layer reports and anything else worth showing (JSON-able values;
        each solver documents its keys).
    """

    placement: Placement
    solver: str
    status: str
    objective: float | None = None
    objective_unit: str = ""
    bound: float | None = None
    seconds: float = 0.0
    hot_shard: float | None = None
    baseline: str | None = None
    replan: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.objective is not None and not self.objective_unit:
            raise ValueError(f"solver {self.solver!r} gave an objective without its unit")

    @property
    def gap(self) -> float | None:
        """``(objective - bound) / objective``; None without both."""
        if self.objective is None or self.bound is None:
            return None
        denom = max(abs(self.objective), 1e-12)
        return abs(self.objective - self.bound) / denom

    def record(self) -> dict[str, Any]:
        """What a placement file says of its solver (its ``solver`` section): name,
        status, objective and unit, bound, hot shard, baseline, seconds, and the scalar
        entries of ``details``."""
        out: dict[str, Any] = {
            "name": self.solver,
            "status": self.status,
            "objective": self.objective,
            "objective_unit": self.objective_unit or None,
            "bound": self.bound,
            "hot_shard": self.hot_shard,
            "baseline": self.baseline,
            "seconds": round(float(self.seconds), 4),
        }
        for key, value in self.details.items():
            if key not in out and isinstance(value, str | int | float | bool | np.generic):
                out[key] = value
        return out

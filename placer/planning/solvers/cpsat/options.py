"""The ``cpsat`` solver's options: one frozen dataclass, read from ``SolveParams.options``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placer import constants
from placer.errors import Param, UsageError
from placer.planning.solvers.options import coerce

#: Values of ``CpsatOptions.robust``.
ROBUST_MODES = ("max", "cvar", "std", "mean")


@dataclass(frozen=True)
class CpsatOptions:
    """The ``cpsat`` solver's own options (``SolveParams.options``).

    On the command line the first six have flags of their own (``--balance-tolerance``,
    ``--traffic-first``, ``--traffic-weight``, ``--migration-weight``, ``--robust``,
    ``--noise-batch-tokens``); every one can be given as ``--option KEY=VALUE``.

    Attributes
    ----------
    balance_tolerance: relative slack on the hot-shard load that the traffic and
        migration objectives may spend (0.005 = 0.5%).
    traffic_first: measure ``balance_tolerance`` from the hint's (EPLB's) hot shard,
        which the second pass may then exceed, instead of from the balance lower bound
        (capped at EPLB's hot shard).
    traffic_weight: weight of co-location versus migration once balance is fixed.
    migration_weight: weight of one weight move (re-planning from ``problem.current``).
    robust: balance the worst window (``"max"``), the mean of the worst windows
        (``"cvar"``), the mean load plus its spread over windows (``"std"``), or the
        summed load (``"mean"``).
    batch_tokens: plan for the hot shard of batches of this many tokens: each GPU's
        per-batch load noise is added (``layer.batch_variance``); None plans for the
        windows' loads alone.
    hint: solver whose placement seeds the search and is kept when CP-SAT does not
        beat it (default ``"eplb-valid"``: EPLB with at most one replica of an expert per
        GPU, which the CP-SAT model assumes).
    neighbourhood_slots: slots freed per large-neighbourhood step.
    balance_iterations, cost_iterations: most steps of each pass per layer.
    patience: a pass stops after this many steps in a row without improvement.
    cost_patience: the traffic/migration pass stops after ``min(patience, cost_patience)``
        such steps (its steps are the slow ones; late ones rarely pay).
    submodel_dtime: CP-SAT deterministic-time limit of one step.
    full_model_max_vars: layers whose full model is at most this big are solved in
        one model (exact status and bound) instead of by neighbourhoods.
    full_model_dtime: deterministic-time limit of a full model.
    pair_mass, pairs_per_expert: co-activation pairs kept (``traffic.select_pairs``).
    cvar_fraction: with ``robust="cvar"``, the share of windows (the worst ones) whose
        hot shards objective 1 averages.
    noise_z: with a batch size (``SolveParams.batch_tokens``), the standard deviations
        of per-batch load noise added to each GPU's load (``layer.batch_noise``).
    keep_nodes: keep the hint's expert-to-node packing (every replica of an expert on
        the nodes the hint puts it on): ``auto`` does so for group-limited models on
        several nodes under normal (prefill) all-to-all kernels, where a token pays one
        inter-node copy per node it touches and EPLB's hierarchical policy packs whole
        expert groups to nodes to keep that number low; low-latency (decode) kernels
        send one copy per selection, so there the planner balances freely.  ``yes``
        always, ``no`` never.
    window_packing: a fresh plan's neighbourhood search starts from the hint's replicas
        packed again window by window when that balances better
        (:func:`placer.planning.solvers.cpsat.packing.window_packing`).
    max_windows: most windows a layer's model holds; more fitted windows are merged,
        consecutive ones summed, into this many (0: every window).
    """

    balance_tolerance: float = 0.005
    traffic_first: bool = False
    traffic_weight: float = 1.0
    migration_weight: float = constants.DEFAULT_MIGRATION_WEIGHT
    robust: str = "max"
    batch_tokens: int | None = None
    hint: str = "eplb-valid"
    neighbourhood_slots: int = constants.CPSAT_NEIGHBOURHOOD_SLOTS
    balance_iterations: int = constants.CPSAT_BALANCE_ITERATIONS
    cost_iterations: int = constants.CPSAT_COST_ITERATIONS
    patience: int = constants.CPSAT_PATIENCE
    cost_patience: int = constants.CPSAT_COST_PATIENCE
    submodel_dtime: float = constants.CPSAT_SUBMODEL_DTIME
    full_model_max_vars: int = constants.CPSAT_FULL_MODEL_MAX_VARS
    full_model_dtime: float = constants.CPSAT_FULL_MODEL_DTIME
    pair_mass: float = constants.CPSAT_PAIR_MASS
    pairs_per_expert: int = constants.CPSAT_PAIRS_PER_EXPERT
    cvar_fraction: float = constants.CPSAT_CVAR_FRACTION
    noise_z: float = constants.CPSAT_NOISE_Z
    keep_nodes: str = "auto"
    window_packing: bool = True
    max_windows: int = constants.CPSAT_MAX_WINDOWS

    def __post_init__(self) -> None:
        if not 0 <= self.balance_tolerance <= 1:
            raise UsageError(f"expected balance tolerance in [0, 1], got {self.balance_tolerance}",
                             where=Param("balance_tolerance"))
        for name in ("traffic_weight", "migration_weight"):
            if not float(getattr(self, name)) >= 0:
                raise UsageError(f"expected {name} >= 0", where=f"--{name.replace('_', '-')}")
        if self.robust not in ROBUST_MODES:
            raise UsageError(f"robust must be one of {', '.join(ROBUST_MODES)}, got"
                             f" {self.robust!r}", where=Param("robust"))
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise UsageError(f"expected batch tokens >= 1, got {self.batch_tokens}",
                             where=Param("noise_batch_tokens"),
                             hint="give a value >= 1; the nearest valid one is 1")
        for name in ("neighbourhood_slots", "patience", "cost_patience", "pairs_per_expert"):
            if int(getattr(self, name)) < 1:
                raise UsageError(f"expected {name} >= 1", where=Param(f"options.{name}"))
        for name in ("balance_iterations", "cost_iterations", "full_model_max_vars",
                     "max_windows"):
            if int(getattr(self, name)) < 0:
                raise UsageError(f"expected {name} >= 0", where=Param(f"options.{name}"))
        for name in ("submodel_dtime", "full_model_dtime"):
            if not float(getattr(self, name)) > 0:
                raise UsageError(f"expected {name} > 0", where=Param(f"options.{name}"))
        if not self.noise_z >= 0:
            raise UsageError("expected noise_z >= 0", where=Param("options.noise_z"))
        if not 0 < self.cvar_fraction <= 1:
            raise UsageError("expected cvar_fraction in (0, 1]",
                             where=Param("options.cvar_fraction"))
        if not 0 < self.pair_mass <= 1:
            raise UsageError("expected pair_mass in (0, 1]", where=Param("options.pair_mass"))
        if self.keep_nodes not in ("auto", "yes", "no"):
            raise UsageError("expected keep_nodes auto, yes or no",
                             where=Param("options.keep_nodes"))
        if self.hint == "cpsat":
            raise UsageError("the hint cannot be cpsat itself", where=Param("options.hint"))

    @classmethod
    def from_options(cls, options: Any) -> CpsatOptions:
        """From ``SolveParams.options``: an instance, a mapping of values or strings, or
        None (:func:`placer.planning.solvers.options.coerce`)."""
        return coerce(cls, options, "cpsat")

"""The CP-SAT model of one layer, built over a neighbourhood of GPUs.

A placement of one layer is ``X: [E, G]`` bool.  A model frees the GPUs ``K`` (all
GPUs for the full model, a few for a large-neighbourhood step): every slot of a GPU
in ``K`` is re-decided, every other slot keeps its expert.  The experts that held a
slot in ``K`` are the free experts ``F``; they may also change their replica count,
which changes their load on GPUs outside ``K`` too, so those loads are modelled.

Variables (names carry their indices, as ``x_{e}_{g}``):

- ``x[e, g]``  expert ``e`` in ``F`` has a replica on GPU ``g`` in ``K``;
- ``y[e, c]``  expert ``e`` has ``c`` replicas (only when it has several choices);
- ``z[e, g, c] = x[e, g] AND y[e, c]``, so that a GPU's load
  ``sum_e sum_c load[w, e] / c * z[e, g, c]`` is linear;
- ``T``        the hottest GPU's load over windows (balance objective); with a
  tail of ``k > 1`` windows, ``T_w`` per window and the sum of the ``k`` largest as
  ``k t + sum_w max(0, T_w - t)`` (the linear form of the conditional value at risk);
- ``s[i, j, g]``, ``n[i, k]``, ``t[i, j, k]``  pair ``(i, j)`` shares GPU ``g``;
  expert ``i`` is on node ``k``; pair shares node ``k`` (traffic objective).

Loads are window shares scaled to integers (``layer.load_scale``): a GPU's integer
load is its hot-shard ratio times ``scale / G``.
"""

from __future__ import annotations

import itertools
import signal
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from placer import constants
from placer.planning.solvers.cpsat import stop
from placer.planning.solvers.cpsat.layer import LayerData

BALANCE = "balance"
COST = "cost"


@dataclass(frozen=True)
class SubResult:
    """What one CP-SAT solve returned.

    Attributes
    ----------
    x: ``[E, G]`` bool, the whole layer with the neighbourhood re-decided, or None
        when CP-SAT found no solution.
    status: CP-SAT's status name (``OPTIMAL``, ``FEASIBLE``, ``UNKNOWN``, ...).
    objective, bound: CP-SAT's objective value and best bound (model units).
    dtime: deterministic time spent.
    """

    x: np.ndarray | None
    status: str
    objective: float
    bound: float
    dtime: float


class _GpuLoad:
    """The load of one GPU the model can change, every window: ``table[w] @ variables
    + constant[w]`` (``table: [W, n]`` int64, ``constant: [W]``).

    Its bounds are written into the proto as CP-SAT writes a linear constraint: terms
    by ascending variable index, zero terms left out, the constant moved to the domain.
    """

    def __init__(self, variables: list[cp_model.IntVar], table: np.ndarray,
                 constant: np.ndarray) -> None:
        self.variables, self.table, self.constant = variables, table, constant
        order = np.argsort([v.index for v in variables], kind="stable")
        index = np.array([variables[i].index for i in order.tolist()], dtype=np.int64)
        sorted_table = table[:, order]
        nonzero = sorted_table != 0
        self._index = np.broadcast_to(index, sorted_table.shape)[nonzero].tolist()
        self._coeffs = sorted_table[nonzero].tolist()
        self._negated = (-sorted_table[nonzero]).tolist()
        self._starts = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))]).tolist()
        self._constants = constant.tolist()
        self._last = int(index.max()) if index.size else -1

    @property
    def terms(self) -> int:
        """Its non-zero terms over every window: what writing and presolving it costs."""
        return len(self._coeffs)

    def expression(self, w: int) -> cp_model.LinearExprT:
        """Window ``w``'s load as a linear expression."""
        return (cp_model.LinearExpr.weighted_sum(self.variables, self.table[w].tolist())
                + int(self.constant[w]))

    def add_at_least(self, model: cp_model.CpModel, var: cp_model.IntVar, w: int) -> None:
        """``var >= load[w]``: the load's terms negated, then ``var`` (the newest
        variable), domain ``[constant, max]``."""
        if var.index <= self._last:  # not the newest variable: let CP-SAT order the terms
            model.add(var >= self.expression(w))
            return
        a, b = self._starts[w], self._starts[w + 1]
        linear = model.proto.constraints.add().linear
        linear.vars.extend(self._index[a:b])
        linear.vars.append(var.index)
        linear.coeffs.extend(self._negated[a:b])
        linear.coeffs.append(1)
        linear.domain.extend((self._constants[w], cp_model.INT_MAX))

    def add_at_most(self, model: cp_model.CpModel, w: int, limit: int) -> None:
        """``load[w] <= limit``: domain ``[min, limit - constant]``."""
        a, b = self._starts[w], self._starts[w + 1]
        linear = model.proto.constraints.add().linear
        linear.vars.extend(self._index[a:b])
        linear.coeffs.extend(self._coeffs[a:b])
        linear.domain.extend((cp_model.INT_MIN, limit - self._constants[w]))


class LayerModel:
    """CP-SAT model of one layer with the GPUs ``gpus`` free.

    Parameters
    ----------
    data: the layer.
    x: ``[E, G]`` bool, the placement to start from (also the hint).
    gpus: GPUs whose slots are re-decided (sorted, distinct).
    mode: ``"balance"`` (minimize the hottest GPU) or ``"cost"`` (minimize traffic and
        moves with every GPU's load at most ``cap``).
    scale: integer scale of the loads.
    cap: hot-shard ratio the cost mode may not exceed.
    traffic_weight, migration_weight: weights of the cost mode.
    free_counts: whether free experts may change their replica count.
    symmetry: order identical GPUs of a node by load (full model, no current placement).
    """

    def __init__(
        self,
        data: LayerData,
        x: np.ndarray,
        gpus: np.ndarray,
        *,
        mode: str,
        scale: float,
        cap: float | None = None,
        traffic_weight: float = 1.0,
        migration_weight: float = 1.0,
        free_counts: bool = True,
        symmetry: bool = False,
    ) -> None:
        self.data = data
        self.start = x
        self.gpus = np.asarray(gpus, dtype=np.int64)
        self.mode = mode
        self.scale = scale
        self.unit = scale / data.num_gpus  # integer load of a GPU at ratio 1.0
        self.model = cp_model.CpModel()
        self.x: dict[tuple[int, int], cp_model.IntVar] = {}
        self.y: dict[tuple[int, int], cp_model.IntVar] = {}
        self.z: dict[tuple[int, int, int], cp_model.IntVar] = {}
        self.counts: dict[int, list[int]] = {}
        self.loads: dict[tuple[int, int], _GpuLoad] = {}  # (window, GPU) -> the GPU's load
        self._gpu_load: dict[int, _GpuLoad] = {}
        self.constant_load = np.zeros(data.num_windows, dtype=np.int64)

        self._select_free_experts(free_counts)
        self._add_slot_constraints()
        self._add_replica_constraints()
        self._add_load_expressions()
        if mode == BALANCE:
            self.model.minimize(self._hot_expression())
        else:
            assert cap is not None  # internal: the search always passes a cap in cost mode
            self._add_load_cap(cap)
            terms = self._add_colocation_terms(traffic_weight) + self._add_move_terms(
                migration_weight
            )
            self.model.minimize(_sum(terms))
        if symmetry:
            self._add_symmetry_breaking()
        self._add_hint()

    # -- building steps ----------------------------------------------------------------
    def _select_free_experts(self, free_counts: bool) -> None:
        """Free experts: those holding a slot in K; their allowed replica counts."""
        data, x = self.data, self.start
        in_k = np.zeros(data.num_gpus, dtype=bool)
        in_k[self.gpus] = True
        self.in_k = in_k
        self.free = np.flatnonzero(x[:, in_k].any(axis=1))
        self.fixed = x & ~in_k[None, :]  # replicas that stay where they are
        self.gpu_list: list[int] = self.gpus.tolist()
        self.free_list: list[int] = self.free.tolist()
        self.outside: list[int] = self.fixed.sum(axis=1).tolist()
        now_counts = x.sum(axis=1).tolist()
        rooms = [self.gpus.size] * data.num_experts
        if data.allowed is not None:
            rooms = data.allowed[:, self.gpus].sum(axis=1).tolist()
        ranges = data.replica_range.tolist()
        for e in self.free_list:
            outside = self.outside[e]
            now = now_counts[e]
            if free_counts:
                low, high = (int(v) for v in ranges[e])
                low = max(low, outside, 1)
                high = min(high, outside + rooms[e])
                options = set(range(low, high + 1)) | {now}
            else:
                options = {now}
            self.counts[e] = sorted(options)

    def _add_slot_constraints(self) -> None:
        """Every freed GPU holds exactly S replicas, at most one per expert; an expert
        stays on the GPUs it is allowed on (its home nodes, when the layer keeps them)."""
        allowed = None if self.data.allowed is None else self.data.allowed.tolist()
        gpus, free = self.gpu_list, self.free_list
        for e in free:
            for g in gpus:
                self.x[e, g] = self.model.new_bool_var(f"x_{e}_{g}")
                if allowed is not None and not allowed[e][g]:
                    self.model.add(self.x[e, g] == 0)
        for g in gpus:
            self.model.add(_sum([self.x[e, g] for e in free]) == self.data.slots_per_gpu)

    def _add_replica_constraints(self) -> None:
        """Each free expert has one replica count; its replicas in K make up the difference."""
        m, gpus = self.model, self.gpu_list
        for e in self.free_list:
            outside = self.outside[e]
            in_k = _sum([self.x[e, g] for g in gpus])
            options = self.counts[e]
            if len(options) == 1:
                m.add(in_k == options[0] - outside)
                continue
            for c in options:
                self.y[e, c] = m.new_bool_var(f"y_{e}_{c}")
            m.add_exactly_one(self.y[e, c] for c in options)
            m.add(in_k == cp_model.LinearExpr.weighted_sum(
                [self.y[e, c] for c in options], [c - outside for c in options]))
            for c in options:
                for g in gpus:
                    self.z[e, g, c] = m.new_bool_var(f"z_{e}_{g}_{c}")
                    m.add_implication(self.z[e, g, c], self.y[e, c])
                # z links x and y: with c replicas, c - outside of them are in K
                m.add(_sum([self.z[e, g, c] for g in gpus]) == (c - outside) * self.y[e, c])
            for g in gpus:
                m.add(_sum([self.z[e, g, c] for c in options]) == self.x[e, g])

    def _add_load_expressions(self) -> None:
        """Integer load of every GPU in every window that the model can change.

        The integer coefficients (``round(share x scale)``, one table per replica count)
        and the loads of GPUs outside ``K`` that hold no expert of changing count
        (constants) are computed as arrays.  A GPU's load has the same variables in every
        window, only their coefficients change: one :class:`_GpuLoad` per GPU holds its
        variables and a ``[W, n]`` coefficient table, and writes the load's bounds into
        the proto directly (the model is the one term-by-term expressions give, proto for
        proto: tests/planning/test_cpsat_model_build.py)."""
        data, x = self.data, self.start
        current_counts = x.sum(axis=1)
        free_set = set(self.free.tolist())
        multi = {e for e in free_set if len(self.counts[e]) > 1}
        needed = {int(c) for c in current_counts} | {c for cs in self.counts.values() for c in cs}
        coef = {c: np.round(data.effective_share(c) * self.scale).astype(np.int64)
                for c in needed if c > 0}  # [W, E] per count, as round() gives them
        # no GPU carries more than every expert's whole (one-replica) share
        self.load_top = int(np.ceil(data.effective_share(1).sum(axis=1).max() * self.scale))
        # each expert's coefficient at its count when it does not change ([W, E])
        fixed_count = current_counts.copy()
        for e in free_set - multi:
            fixed_count[e] = self.counts[e][0]
        at_count = np.zeros((data.num_windows, data.num_experts), dtype=np.int64)
        for c in np.unique(fixed_count[fixed_count > 0]).tolist():
            at_count[:, fixed_count == c] = coef[c][:, fixed_count == c]
        holds_multi = np.zeros(data.num_experts, dtype=bool)
        holds_multi[sorted(multi)] = True
        outside = x & ~holds_multi[:, None]  # [E, G] replicas of unchanging count
        constant = at_count @ outside.astype(np.int64)  # [W, G]
        free = self.free_list
        # a freed GPU's load: the same terms' coefficients on every freed GPU ([W, n] rows)
        columns: list[np.ndarray] = []
        for e in free:
            if e in multi:
                columns += [coef[c][:, e] for c in self.counts[e]]
            else:
                columns.append(at_count[:, e])
        if columns:
            rows = np.stack(columns, axis=1)
            for g in self.gpu_list:
                variables = [v for e in free for v in self._load_vars(e, g, multi)]
                self._gpu_load[g] = _GpuLoad(variables, rows, np.zeros_like(constant[:, g]))
        # a GPU outside K: constant, plus the terms of its experts that change count
        for g in np.flatnonzero(~self.in_k).tolist():
            changing = [e for e in np.flatnonzero(x[:, g]).tolist() if e in multi]
            if changing:
                terms = [(e, c) for e in changing for c in self.counts[e]]
                table = np.stack([coef[c][:, e] for e, c in terms], axis=1)
                self._gpu_load[g] = _GpuLoad([self.y[e, c] for e, c in terms], table,
                                             constant[:, g])
        for w in range(data.num_windows):
            for g in range(data.num_gpus):
                if g in self._gpu_load:
                    self.loads[w, g] = self._gpu_load[g]
        plain = ~self.in_k
        plain[list(self._gpu_load)] = False  # GPUs whose load the model cannot change
        if plain.any():
            self.constant_load = np.maximum(self.constant_load, constant[:, plain].max(axis=1))

    @property
    def load_terms(self) -> int:
        """The non-zero terms of every GPU load the model can change, over every window:
        the measure of its size the search's work accounting reads."""
        return sum(load.terms for load in self._gpu_load.values())

    def _load_vars(self, e: int, g: int, multi: set[int]) -> list[cp_model.IntVar]:
        """The variables of free expert ``e``'s load on freed GPU ``g``."""
        if e in multi:
            return [self.z[e, g, c] for c in self.counts[e]]
        return [self.x[e, g]]

    def _hot_expression(self) -> cp_model.LinearExprT:
        """The hot-shard objective in integer loads, times the tail ``k``.

        ``k = 1``: one ``T`` above every GPU's load in every window.  ``k > 1``: the sum
        of the ``k`` largest window maxima ``T_w``, as ``k t + sum_w u_w`` with
        ``u_w >= T_w - t``, ``u_w >= 0`` (exact at the optimum over ``t``).
        """
        m, data = self.model, self.data
        top = int(self.load_top * 2 + int(self.constant_load.max()) + 1)
        tail = self.objective_windows
        if tail == 1:
            hottest = m.new_int_var(int(self.constant_load.max()), top, "T")
            for (w, _), load in self.loads.items():
                load.add_at_least(m, hottest, w)
            return hottest
        level = m.new_int_var(0, top, "t")
        excess = []
        for w in range(data.num_windows):
            peak = m.new_int_var(int(self.constant_load[w]), top, f"T_{w}")
            for g in range(data.num_gpus):
                if (w, g) in self.loads:
                    self.loads[w, g].add_at_least(m, peak, w)
            u = m.new_int_var(0, top, f"u_{w}")
            m.add(u >= peak - level)
            excess.append(u)
        return tail * level + sum(excess)

    def _add_load_cap(self, cap: float) -> None:
        """The hot shard may not exceed the cap (rounding slack: S / 2 per window).

        With a tail of one window every GPU's load in every window is capped; with a
        longer tail, the mean of the tail windows' maxima.
        """
        limit = int(np.floor(cap * self.unit)) + (self.data.slots_per_gpu + 1) // 2
        if self.objective_windows == 1:
            for (w, _), load in self.loads.items():
                load.add_at_most(self.model, w, limit)
            return
        self.model.add(self._hot_expression() <= self.objective_windows * limit)

    @property
    def objective_windows(self) -> int:
        """Windows the balance objective sums (divide its value by this and ``unit``)."""
        return min(max(self.data.tail, 1), self.data.num_windows)

    def _add_colocation_terms(self, weight: float) -> list[cp_model.LinearExprT]:
        """Reward pairs of co-activated experts on one GPU and, across nodes, on one node.

        Coefficients use the replica counts of the starting placement (exact when
        counts do not change; the search re-scores every candidate exactly).
        """
        data = self.data
        reference = data.traffic_reference()
        if weight <= 0 or reference <= 0 or data.pairs.size == 0:
            return []
        m = self.model
        counts = self.start.sum(axis=1).astype(np.float64)
        free_set = set(self.free.tolist())
        factor = weight * constants.CPSAT_COST_SCALE / reference
        terms: list[cp_model.LinearExprT] = []
        multi_node = data.num_nodes > 1
        node_gpus = {
            k: [g for g in self.gpu_list if data.node_of_gpu[g] == k]
            for k in range(data.num_nodes)
        }
        node_vars: dict[tuple[int, int], cp_model.IntVar] = {}
        # replicas that stay, per expert and node ([E, N]: one product, not a sum per pair)
        fixed_on = (self.fixed.astype(np.int64)
                    @ np.eye(data.num_nodes, dtype=np.int64)[data.node_of_gpu]).tolist()

        def on_node(e: int, k: int) -> cp_model.IntVar:
            if (e, k) not in node_vars:
                var = m.new_bool_var(f"n_{e}_{k}")
                m.add(var <= _sum([self.x[e, g] for g in node_gpus[k]]))
                node_vars[e, k] = var
            return node_vars[e, k]

        for (i, j), rate in zip(data.pairs.tolist(), data.pair_rate.tolist(), strict=True):
            fi, fj = i in free_set, j in free_set
            if not (fi or fj):
                continue
            base = factor * rate / (counts[i] * counts[j])
            gpu_coef = round(base * data.gpu_cost)
            if fi and fj and gpu_coef > 0:
                for g in self.gpu_list:
                    s = m.new_bool_var(f"s_{i}_{j}_{g}")
                    m.add_implication(s, self.x[i, g])
                    m.add_implication(s, self.x[j, g])
                    terms.append(-gpu_coef * s)
            node_coef = base * data.node_cost
            if not multi_node or node_coef <= 0:
                continue
            for k, members in node_gpus.items():
                if not members:
                    continue
                fixed_i, fixed_j = fixed_on[i][k], fixed_on[j][k]
                # a_i a_j = (fixed_i + X_i)(fixed_j + X_j): the cross terms are linear
                if fi and fixed_j:
                    coef = round(node_coef * fixed_j)
                    terms += [-coef * self.x[i, g] for g in members]
                if fj and fixed_i:
                    coef = round(node_coef * fixed_i)
                    terms += [-coef * self.x[j, g] for g in members]
                if fi and fj and round(node_coef) > 0:
                    t = m.new_bool_var(f"t_{i}_{j}_{k}")
                    m.add_implication(t, on_node(i, k))
                    m.add_implication(t, on_node(j, k))
                    terms.append(-round(node_coef) * t)
        return terms

    def _add_move_terms(self, weight: float) -> list[cp_model.LinearExprT]:
        """Charge every replica placed on a GPU that does not hold that expert now."""
        current = self.data.current
        if current is None or weight <= 0:
            return []
        coef = round(weight * constants.CPSAT_COST_SCALE / self.data.num_physical)
        return [
            coef * self.x[e, g]
            for e in self.free_list
            for g in self.gpu_list
            if not current[e, g]
        ]

    def _add_symmetry_breaking(self) -> None:
        """Identical GPUs of one node hold non-increasing summed loads in rank order."""
        node = self.data.node_of_gpu
        gpus = self.gpus.tolist()
        for a, b in itertools.pairwise(gpus):
            if node[a] != node[b]:
                continue
            total_a = _sum([self.loads[w, a].expression(w) for w in range(self.data.num_windows)])
            total_b = _sum([self.loads[w, b].expression(w) for w in range(self.data.num_windows)])
            self.model.add(total_a >= total_b)

    def _add_hint(self) -> None:
        """Start the search from the given placement."""
        x = self.start.tolist()
        counts = self.start.sum(axis=1).tolist()
        hint = self.model.proto.solution_hint
        hint.vars.extend([var.index for var in self.x.values()])
        hint.values.extend([int(x[e][g]) for e, g in self.x])
        hint.vars.extend([var.index for var in self.y.values()])
        hint.values.extend([int(counts[e] == c) for e, c in self.y])
        hint.vars.extend([var.index for var in self.z.values()])
        hint.values.extend([int(x[e][g] and counts[e] == c) for e, g, c in self.z])

    # -- solving ---------------------------------------------------------------------------
    def solve(self, dtime: float, wall: float, seed: int, lns: bool = False) -> SubResult:
        """Solve with one worker and a fixed seed (reproducible under the dtime limit).

        ``lns``: a neighbourhood step; the LP relaxation and presolve's probing are
        switched off there, as these small models are solved faster by search alone
        (probing took a third of a step's solve; without it the steps reach balances as
        good or better within the same wall time, docs/performance.md "Plans at scale").
        """
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.catch_sigint_signal = False  # Ctrl-C is placer's: it stops the run
        if lns:
            solver.parameters.linearization_level = 0
            solver.parameters.cp_model_probing_level = 0
        solver.parameters.random_seed = seed
        solver.parameters.max_deterministic_time = max(dtime, 1e-3)
        solver.parameters.max_time_in_seconds = max(wall, 1e-3)
        handler = _sigint_handler()
        status = stop.solve(solver, self.model)  # Ctrl-C and SIGTERM stop it at once
        _restore_sigint(handler)
        name = solver.status_name(status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return SubResult(None, name, float("nan"), float("nan"), solver.deterministic_time)
        x = self.start.copy()
        x[:, self.in_k] = False
        for (e, g), var in self.x.items():
            x[e, g] = bool(solver.value(var))
        return SubResult(
            x, name, solver.objective_value, solver.best_objective_bound,
            solver.deterministic_time,
        )


def _sigint_handler() -> Any:
    """The SIGINT handler now (None off the main thread, where it cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.getsignal(signal.SIGINT)


def _restore_sigint(handler: Any) -> None:
    """Put back the SIGINT handler a solve found: OR-Tools may install its own for a solve
    and leave the system default behind, which kills placer without cleaning up (the
    solver is also told not to catch SIGINT: Ctrl-C stops the run, not one solve)."""
    if handler is not None and signal.getsignal(signal.SIGINT) is not handler:
        signal.signal(signal.SIGINT, handler)


def _sum(items: list[Any]) -> Any:
    """``sum(items)`` as one linear expression (0 when empty, as Python's ``sum``)."""
    return cp_model.LinearExpr.sum(items) if items else 0

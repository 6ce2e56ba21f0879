"""The CP-SAT layer model is built from arrays (weighted sums, coefficient rows); its
proto must equal the one a plain term-by-term construction gives, so that the search,
and every plan, stays the same.  ``_Reference`` below is that plain construction: each
building step written as the model reads (one Python term per variable)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from ortools.sat.python import cp_model

from placer.planning.solvers.cpsat.layer import LayerData
from placer.planning.solvers.cpsat.model import BALANCE, COST, LayerModel


class _Reference(LayerModel):
    """LayerModel with every building step written term by term."""

    def _select_free_experts(self, free_counts: bool) -> None:
        data, x = self.data, self.start
        self.in_k = np.zeros(data.num_gpus, dtype=bool)
        self.in_k[self.gpus] = True
        self.free = np.array([e for e in range(data.num_experts)
                              if any(x[e, g] for g in self.gpus.tolist())], dtype=np.int64)
        self.fixed = x & ~self.in_k[None, :]
        self.gpu_list, self.free_list = self.gpus.tolist(), self.free.tolist()
        for e in self.free_list:
            outside, now = int(self.fixed[e].sum()), int(x[e].sum())
            options = {now}
            if free_counts:
                room = len(self.gpu_list) if data.allowed is None else int(
                    sum(data.allowed[e, g] for g in self.gpu_list))
                low = max(int(data.replica_range[e, 0]), outside, 1)
                high = min(int(data.replica_range[e, 1]), outside + room)
                options |= set(range(low, high + 1))
            self.counts[e] = sorted(options)

    def _add_slot_constraints(self) -> None:
        allowed = self.data.allowed
        for e in self.free_list:
            for g in self.gpu_list:
                self.x[e, g] = self.model.new_bool_var(f"x_{e}_{g}")
                if allowed is not None and not allowed[e, g]:
                    self.model.add(self.x[e, g] == 0)
        for g in self.gpu_list:
            self.model.add(sum(self.x[e, g] for e in self.free_list) == self.data.slots_per_gpu)

    def _add_replica_constraints(self) -> None:
        m = self.model
        for e in self.free_list:
            outside = int(self.fixed[e].sum())
            in_k = sum(self.x[e, g] for g in self.gpu_list)
            options = self.counts[e]
            if len(options) == 1:
                m.add(in_k == options[0] - outside)
                continue
            for c in options:
                self.y[e, c] = m.new_bool_var(f"y_{e}_{c}")
            m.add_exactly_one(self.y[e, c] for c in options)
            m.add(in_k == sum((c - outside) * self.y[e, c] for c in options))
            for c in options:
                for g in self.gpu_list:
                    self.z[e, g, c] = m.new_bool_var(f"z_{e}_{g}_{c}")
                    m.add_implication(self.z[e, g, c], self.y[e, c])
                m.add(sum(self.z[e, g, c] for g in self.gpu_list) == (c - outside) * self.y[e, c])
            for g in self.gpu_list:
                m.add(sum(self.z[e, g, c] for c in options) == self.x[e, g])

    def _add_load_expressions(self) -> None:
        self.loads: dict = {}  # type: ignore[assignment]  # expressions here
        data, x = self.data, self.start
        now = x.sum(axis=1)
        multi = {e for e in self.free_list if len(self.counts[e]) > 1}
        count = {e: (self.counts[e][0] if e in self.counts else int(now[e]))
                 for e in range(data.num_experts)}

        def share(w: int, e: int, c: int) -> int:
            return int(np.round(data.effective_share(c)[w, e] * self.scale))

        self.load_top = int(np.ceil(data.effective_share(1).sum(axis=1).max() * self.scale))
        for w, g in itertools.product(range(data.num_windows), range(data.num_gpus)):
            terms: list[cp_model.LinearExprT] = []
            value = 0
            for e in range(data.num_experts):
                if self.in_k[g] and e in self.counts:
                    if e in multi:
                        terms += [share(w, e, c) * self.z[e, g, c] for c in self.counts[e]]
                    else:
                        terms.append(share(w, e, count[e]) * self.x[e, g])
                elif not self.in_k[g] and x[e, g]:
                    if e in multi:
                        terms += [share(w, e, c) * self.y[e, c] for c in self.counts[e]]
                    else:
                        value += share(w, e, count[e])
            if terms:
                self.loads[w, g] = sum(terms) + value
            else:
                self.constant_load[w] = max(self.constant_load[w], value)

    def _hot_expression(self) -> cp_model.LinearExprT:
        m, data = self.model, self.data
        top = int(self.load_top * 2 + int(self.constant_load.max()) + 1)
        if self.objective_windows == 1:
            hottest = m.new_int_var(int(self.constant_load.max()), top, "T")
            for expr in self.loads.values():
                m.add(hottest >= expr)
            return hottest
        level = m.new_int_var(0, top, "t")
        excess = []
        for w in range(data.num_windows):
            peak = m.new_int_var(int(self.constant_load[w]), top, f"T_{w}")
            for g in range(data.num_gpus):
                if (w, g) in self.loads:
                    m.add(peak >= self.loads[w, g])
            u = m.new_int_var(0, top, f"u_{w}")
            m.add(u >= peak - level)
            excess.append(u)
        return self.objective_windows * level + sum(excess)

    def _add_load_cap(self, cap: float) -> None:
        limit = int(np.floor(cap * self.unit)) + (self.data.slots_per_gpu + 1) // 2
        if self.objective_windows == 1:
            for expr in self.loads.values():
                self.model.add(expr <= limit)
            return
        self.model.add(self._hot_expression() <= self.objective_windows * limit)

    def _add_symmetry_breaking(self) -> None:
        node, windows = self.data.node_of_gpu, range(self.data.num_windows)
        for a, b in itertools.pairwise(self.gpu_list):
            if node[a] == node[b]:
                self.model.add(sum(self.loads[w, a] for w in windows)
                               >= sum(self.loads[w, b] for w in windows))

    def _add_hint(self) -> None:
        x, counts = self.start, self.start.sum(axis=1)
        for (e, g), var in self.x.items():
            self.model.add_hint(var, bool(x[e, g]))
        for (e, c), var in self.y.items():
            self.model.add_hint(var, int(counts[e]) == c)
        for (e, g, c), var in self.z.items():
            self.model.add_hint(var, bool(x[e, g]) and int(counts[e]) == c)


def _placement(rng: np.random.Generator, experts: int, gpus: int, slots: int) -> np.ndarray:
    """``[E, G]`` bool: every expert at least once, ``slots`` distinct experts a GPU."""
    x = np.zeros((experts, gpus), dtype=bool)
    for p, e in enumerate(rng.permutation(experts).tolist()):
        x[e, p % gpus] = True
    for g in range(gpus):
        while x[:, g].sum() < slots:
            x[rng.choice(np.flatnonzero(~x[:, g])), g] = True
    return x


def _layer(seed: int, *, current: bool, allowed: bool, tail: int, noise: bool,
           windows: int = 4) -> tuple[LayerData, np.ndarray]:
    rng = np.random.default_rng(seed)
    experts, gpus, slots, nodes = 12, 6, 3, 2
    shares = rng.dirichlet(np.full(experts, 0.5), size=windows)
    x = _placement(rng, experts, gpus, slots)
    pairs = np.array(sorted({tuple(sorted(rng.choice(experts, 2, replace=False).tolist()))
                             for _ in range(10)}), dtype=np.int64)
    data = LayerData(
        layer_id=seed, shares=shares, mean_share=shares.mean(axis=0),
        num_gpus=gpus, slots_per_gpu=slots,
        node_of_gpu=np.repeat(np.arange(nodes), gpus // nodes),
        pairs=pairs, pair_rate=rng.uniform(0.01, 0.3, len(pairs)), gpu_cost=1.0,
        node_cost=3.0, current=_placement(rng, experts, gpus, slots) if current else None,
        replica_range=np.stack([np.ones(experts, dtype=np.int64),
                                rng.integers(1, 4, experts)], axis=1),
        scale=1000.0 * gpus, tail=tail,
        noise=rng.uniform(0, 0.01, (windows, experts)) if noise else None,
        noise_weight=0.5 if noise else 0.0,
        allowed=(x | (rng.random(x.shape) < 0.5)) if allowed else None,
    )
    return data, x


def _proto(cls: type[LayerModel], data: LayerData, x: np.ndarray, gpus: np.ndarray,
           **kwargs: object) -> str:
    model = cls(data, x, gpus, scale=data.scale, **kwargs)  # type: ignore[arg-type]
    return str(model.model.Proto())


CASES = [
    # seed, current, allowed, tail, noise
    (0, False, False, 1, False),
    (1, True, False, 1, False),
    (2, False, True, 1, True),
    (3, True, True, 3, False),
    (4, False, False, 2, True),
]


@pytest.mark.parametrize(("seed", "current", "allowed", "tail", "noise"), CASES)
@pytest.mark.parametrize("free_counts", [True, False])
def test_built_model_equals_the_term_by_term_reference(seed, current, allowed, tail, noise,
                                                       free_counts):
    data, x = _layer(seed, current=current, allowed=allowed, tail=tail, noise=noise)
    rng = np.random.default_rng(100 + seed)
    neighbourhoods = [np.arange(data.num_gpus), np.sort(rng.choice(data.num_gpus, 2, False)),
                      np.sort(rng.choice(data.num_gpus, 3, False))]
    cost = {"mode": COST, "cap": 1.3, "traffic_weight": 1.0, "migration_weight": 2.0}
    for gpus in neighbourhoods:
        for kwargs in ({"mode": BALANCE}, cost, {**cost, "traffic_weight": 0.0}):
            built = _proto(LayerModel, data, x, gpus, free_counts=free_counts, **kwargs)
            reference = _proto(_Reference, data, x, gpus, free_counts=free_counts, **kwargs)
            assert built == reference, (gpus, kwargs)
    symmetric = _proto(LayerModel, data, x, np.arange(data.num_gpus), mode=BALANCE,
                       symmetry=True)
    assert symmetric == _proto(_Reference, data, x, np.arange(data.num_gpus), mode=BALANCE,
                               symmetry=True)


def test_reference_differs_when_a_coefficient_differs():
    """The comparison can fail: a model built at another scale has another proto."""
    data, x = _layer(0, current=True, allowed=False, tail=1, noise=False)
    gpus = np.arange(3)
    built = _proto(LayerModel, data, x, gpus, mode=BALANCE)
    other = LayerModel(data, x, gpus, mode=BALANCE, scale=data.scale * 1.01)
    assert built != str(other.model.Proto())


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_load_terms_counts_the_terms_of_the_hot_shards_constraints(seed):
    """Tail 1: each load the model can change is one ``T >= load`` row (``T`` is the last
    variable), so its terms are the rows' terms but ``T``'s."""
    data, x = _layer(seed, current=seed == 1, allowed=False, tail=1, noise=False)
    model = LayerModel(data, x, np.arange(3), mode=BALANCE, scale=data.scale)
    proto = model.model.Proto()
    hottest = len(proto.variables) - 1
    rows = [c.linear for c in proto.constraints if hottest in list(c.linear.vars)]
    assert model.load_terms == sum(len(row.vars) - 1 for row in rows) > 0


def test_a_step_costs_more_work_only_past_the_calibrated_model_size():
    from placer.planning.solvers.cpsat.search import STEP_TERMS, STEP_WORK, step_work

    assert step_work(0) == step_work(STEP_TERMS) == STEP_WORK
    assert step_work(STEP_TERMS + 200_000) > 30 * STEP_WORK  # a 2,048-GPU layer's model

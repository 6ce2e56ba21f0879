"""Fit link and compute efficiencies to measured timings (what ``placer calibrate`` runs).

Model (the evaluator's own, :mod:`placer.evaluate.timing`):

- an ``all_to_all`` row is predicted as :meth:`AllToAllCase.evaluate
  <placer.calibrate.cases.AllToAllCase.evaluate>` predicts it: the case's copy matrix
  (DeepEP-test-style routing, experts placed linearly, the row's communication mode)
  through :func:`~placer.evaluate.timing.comm_time_us` on the base topology grown to the
  case's node count, slowest GPU.  The copies do not depend on the calibration, so they
  are computed once per case and only the :class:`~placer.evaluate.traffic.Fabric`
  (achieved bandwidths, fixed phase costs) is rebuilt for each trial calibration;
- an ``expert_gemm`` row is :func:`~placer.evaluate.timing.compute_time_us` of
  ``num_experts`` slots with ``tokens_per_expert`` tokens each on the topology's first
  GPU, at the rates of the :class:`~placer.evaluate.costs.CostModel` of a one-layer model
  with the row's expert shape: ``num_experts * max(weight_us, tokens * token_us)``
  (``weight_us``: expert bytes over the HBM bandwidth times ``hbm_efficiency``;
  ``token_us``: the expert FFN's flops over the peak TFLOPS times ``flops_efficiency``).

Parameters: for every link technology of the rows' clusters (``Topology.link_kind``)
an efficiency and a fixed phase cost; the compute efficiencies when GEMM rows are
present.  The fit minimises ``sum over rows of log(predicted / measured)^2``.  A
parameter no row's time depends on, or one the rows cannot tell apart from the
parameters already fitted (the columns of the sensitivity matrix are dependent: e.g. a
technology's phase cost when one row uses it), keeps its base value and says why.

Optimiser (numpy only, deterministic): Levenberg–Marquardt on log-efficiencies and
square-rooted phase costs from several starts (the base values, placer's defaults and
two spread-out points), then a Nelder–Mead polish from the best one (the model has kinks
where the slowest bound changes).  Link and compute parameters are fitted separately:
no row depends on both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from placer.calibrate.cases import AllToAllCase
from placer.calibrate.optimize import minimize
from placer.calibrate.timings import AllToAllTiming, GemmTiming, Timing
from placer.errors import UsageError
from placer.evaluate.costs import CostModel
from placer.evaluate.timing import comm_time_us, compute_time_us
from placer.evaluate.traffic import Fabric, Segments, layer_traffic
from placer.model import ModelSpec
from placer.topology import Topology
from placer.topology.calibration import (
    DEFAULT_CALIBRATION,
    Calibration,
    ComputeCalibration,
    LinkCalibration,
)

#: Efficiencies stay in (0, 2] (LinkCalibration's range).
_MAX_EFFICIENCY = 2.0
_MIN_EFFICIENCY = 1e-4
#: Phase costs stay finite (a second per phase is far outside any measurement).
_MAX_PHASE_US = 1e6
#: A sensitivity column below this norm means no row depends on the parameter.
_ZERO_COLUMN = 1e-10
#: Normalised sensitivity columns whose smallest singular value falls below this are
#: taken as dependent (the rows cannot separate the parameters).
_RANK_TOLERANCE = 1e-3


# -- parameters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Param:
    key: str  # link technology, or "compute"
    field: str  # efficiency, phase_us, hbm_efficiency, flops_efficiency

    @property
    def name(self) -> str:
        return f"{self.key}.{self.field}"

    @property
    def is_phase(self) -> bool:
        return self.field == "phase_us"

    def base(self, calibration: Calibration) -> float:
        if self.key == "compute":
            return float(getattr(calibration.compute, self.field))
        return float(getattr(calibration.link(self.key), self.field))

    # optimiser coordinates: log efficiency, sqrt phase cost
    def to_theta(self, value: float) -> float:
        return math.sqrt(max(value, 0.0)) if self.is_phase else math.log(value)

    def from_theta(self, theta: float) -> float:
        if self.is_phase:
            return min(theta * theta, _MAX_PHASE_US)
        return min(max(math.exp(min(theta, 50.0)), _MIN_EFFICIENCY), _MAX_EFFICIENCY)

    # sensitivity coordinates: log efficiency, phase cost in microseconds
    def nudge(self, value: float) -> float:
        return value + max(1e-3, 1e-3 * value) if self.is_phase else value * math.exp(-1e-5)

    def nudge_scale(self, value: float) -> float:
        return max(1e-3, 1e-3 * value) if self.is_phase else -1e-5


def _calibration(values: dict[_Param, float], base: Calibration, keys: Sequence[str],
                 source: str = "") -> Calibration:
    """``keys``' links and the compute figures, ``values`` over ``base``."""
    def get(key: str, field: str) -> float:
        p = _Param(key, field)
        return values[p] if p in values else p.base(base)

    links = {k: LinkCalibration(get(k, "efficiency"), get(k, "phase_us")) for k in keys}
    compute = ComputeCalibration(get("compute", "hbm_efficiency"),
                                 get("compute", "flops_efficiency"))
    return Calibration(links, compute, source)


# -- predictions --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Case:
    """An all-to-all case's calibration-independent part."""

    cluster: int  # index into Predictor._clusters
    mode: str
    copies: np.ndarray  # [1, G, G] dispatch copies
    copies_back: np.ndarray  # [1, G, G] combine copies (the transpose)
    dispatch_bytes: float
    combine_bytes: float


def case_copies(case: AllToAllCase, cluster: Topology) -> np.ndarray:
    """``[1, G, G]`` dispatch copies of ``case`` on ``cluster``, as
    :func:`placer.evaluate.evaluate` counts them for the case (one batch of every token,
    rank-major sources, each expert on GPU ``expert // (E / G)``)."""
    fabric = Fabric.from_topology(cluster, case.mode)
    placement = case.placement()
    ids = case.topk_ids().astype(np.int64)
    num_tokens, top_k = ids.shape
    slots = placement.logical_to_physical[0][ids.ravel(), 0]
    gpu = slots // placement.slots_per_gpu
    token = np.repeat(np.arange(num_tokens, dtype=np.int64), top_k)
    position = np.tile(np.arange(top_k, dtype=np.int64), num_tokens)
    source = np.repeat(np.arange(case.num_gpus, dtype=np.int64), case.tokens_per_gpu)
    segments = Segments.of(np.zeros(num_tokens, dtype=np.int64), source, 1)
    traffic = layer_traffic(token, position, gpu, num_tokens, top_k, segments, fabric,
                            case.mode)
    return traffic.copies


class Predictor:
    """Predicted time of every timing row under any calibration.

    The calibration-independent part (each all-to-all case's routing and copies, each
    GEMM row's bytes and flops) is computed once, here.

    Raises UsageError (naming the row) when a row does not fit the topology: other GPUs
    per node than the topology's first node, several nodes without a network,
    ``low_latency_rdma`` without NICs.
    """

    def __init__(self, rows: Sequence[Timing], topology: Topology):
        self.rows = tuple(rows)
        self.topology = topology
        self.measured = np.array([r.measured_us for r in self.rows], dtype=np.float64)
        self.is_gemm = np.array([isinstance(r, GemmTiming) for r in self.rows], dtype=bool)
        self._clusters: list[Topology] = []
        cluster_of: dict[tuple[int, int], int] = {}
        cases: dict[AllToAllCase, _Case] = {}
        self._a2a: list[tuple[int, _Case, bool]] = []  # (row, case, is dispatch)
        for i, row in enumerate(self.rows):
            if not isinstance(row, AllToAllTiming):
                continue
            case = row.case
            if case not in cases:
                try:
                    size = (case.num_gpus, case.gpus_per_node)
                    if size not in cluster_of:
                        cluster_of[size] = len(self._clusters)
                        self._clusters.append(case.cluster(topology))
                    cluster = self._clusters[cluster_of[size]]
                    copies = case_copies(case, cluster)
                except UsageError as exc:
                    raise UsageError(exc.message, where=row.where or exc.where,
                                     hint=exc.hint) from None
                model = case.model()
                cases[case] = _Case(
                    cluster_of[size], case.mode, copies, copies.transpose(0, 2, 1).copy(),
                    float(model.activation_bytes(case.dtype)),
                    float(model.combine_bytes()),
                )
            self._a2a.append((i, cases[case], row.phase == "dispatch"))
        self._gemm = [(i, r) for i, r in enumerate(self.rows) if isinstance(r, GemmTiming)]

    @property
    def link_keys(self) -> tuple[str, ...]:
        """Link technologies (calibration keys) of the all-to-all rows' clusters."""
        kinds: set[str] = set()
        for cluster in self._clusters:
            kinds.update(str(k) for k in np.unique(cluster.link_kind[:, 1:]) if k)
        return tuple(sorted(kinds))

    def predict(self, calibration: Calibration, which: np.ndarray | None = None) -> np.ndarray:
        """``[rows]`` predicted microseconds with ``calibration`` laid over the
        topology's (NaN for rows outside the ``which`` mask)."""
        out = np.full(len(self.rows), np.nan)
        fabrics: dict[tuple[int, str], Fabric] = {}
        for i, c, dispatch in self._a2a:
            if which is not None and not which[i]:
                continue
            key = (c.cluster, c.mode)
            if key not in fabrics:
                cluster = self._clusters[c.cluster].with_calibration(calibration)
                fabrics[key] = Fabric.from_topology(cluster, c.mode)
            copies, payload = ((c.copies, c.dispatch_bytes) if dispatch
                               else (c.copies_back, c.combine_bytes))
            out[i] = float(comm_time_us(copies, payload, fabrics[key]).max(axis=1).mean())
        gemm = [(i, r) for i, r in self._gemm if which is None or which[i]]
        if gemm:
            topology = self.topology.with_calibration(calibration)
            for i, r in gemm:
                out[i] = gemm_time_us(r, topology)
        return out


def gemm_model(row: GemmTiming) -> ModelSpec:
    """A one-layer model with the row's expert shape (for the expert byte count)."""
    return ModelSpec(
        name=f"gemm-h{row.hidden}-f{row.ffn}", num_hidden_layers=1, moe_layer_ids=(0,),
        num_experts=row.num_experts, top_k=1, num_groups=1, top_groups=1,
        num_shared_experts=0, hidden_size=row.hidden, moe_intermediate_size=row.ffn,
        non_expert_params=0, default_dtype=row.dtype,
    )


def gemm_time_us(row: GemmTiming, topology: Topology) -> float:
    """The evaluator's expert compute time for ``row`` on ``topology``'s first GPU."""
    costs = CostModel.of(topology, gemm_model(row), dtype=row.dtype)
    load = np.full((1, row.num_experts), row.tokens_per_expert, dtype=np.int64)
    # every slot on the first GPU
    t = compute_time_us(load, row.num_experts, costs.weight_us, costs.token_us)
    return float(t.max())


# -- the fit ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FittedParameter:
    """One calibration figure.

    Attributes
    ----------
    name: ``"nvlink.efficiency"``, ``"infiniband.phase_us"``, ``"compute.hbm_efficiency"``.
    base: its value in the base topology.  value: after the fit (``base`` when kept).
    fitted: whether the data determined it.
    stderr: approximate standard error (from the residuals and sensitivities; None when
        kept, or with no more rows than fitted parameters).
    note: why it was kept, or a remark (at a bound).
    """

    name: str
    base: float
    value: float
    fitted: bool
    stderr: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base, "value": self.value,
                "fitted": self.fitted, "stderr": self.stderr, "note": self.note}


@dataclass(frozen=True)
class RowFit:
    """One row: measured, predicted with the base calibration and with the fitted one."""

    row: Timing
    measured_us: float
    before_us: float
    after_us: float

    @property
    def label(self) -> str:
        return self.row.label

    @property
    def ratio_before(self) -> float:
        return self.before_us / self.measured_us

    @property
    def ratio_after(self) -> float:
        return self.after_us / self.measured_us

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "where": self.row.where, "benchmark": self.row.benchmark,
                "measured_us": self.measured_us, "before_us": self.before_us,
                "after_us": self.after_us, "ratio_before": self.ratio_before,
                "ratio_after": self.ratio_after}


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit_calibration` found.

    Attributes
    ----------
    base: the base topology's calibration.
    calibration: the fitted figures as an overlay's ``calibration:`` section: every link
        technology with a fitted parameter, and the compute efficiencies (fitted or
        the base's).
    parameters: every candidate parameter, fitted or kept.
    rows: per row, measured and predicted before / after.
    """

    base: Calibration
    calibration: Calibration
    parameters: tuple[FittedParameter, ...]
    rows: tuple[RowFit, ...]

    @property
    def rms_log_before(self) -> float:
        return _rms([math.log(r.ratio_before) for r in self.rows])

    @property
    def rms_log_after(self) -> float:
        return _rms([math.log(r.ratio_after) for r in self.rows])

    def parameter(self, name: str) -> FittedParameter:
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "parameters": [p.to_dict() for p in self.parameters],
            "rows": [r.to_dict() for r in self.rows],
            "rms_log_before": self.rms_log_before,
            "rms_log_after": self.rms_log_after,
            "calibration": self.calibration.to_dict(),
        }


def _rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


def _sensitivity(predictor: Predictor, which: np.ndarray, params: list[_Param],
                 values: dict[_Param, float], base: Calibration,
                 keys: Sequence[str]) -> np.ndarray:
    """``[rows of which, params]`` d log(predicted) / d (log efficiency | phase us)."""
    def logs(v: dict[_Param, float]) -> np.ndarray:
        return np.log(predictor.predict(_calibration(v, base, keys), which)[which])

    at = logs(values)
    out = np.zeros((int(which.sum()), len(params)))
    for j, p in enumerate(params):
        moved = dict(values)
        moved[p] = p.nudge(values[p])
        out[:, j] = (logs(moved) - at) / p.nudge_scale(values[p])
    return out


def _select(sens: np.ndarray, params: list[_Param]) -> dict[_Param, str]:
    """Parameters the rows cannot determine -> why (greedy, in ``params`` order)."""
    kept: dict[_Param, str] = {}
    chosen: list[int] = []
    norms = np.linalg.norm(sens, axis=0)
    for j, p in enumerate(params):
        if not norms[j] > _ZERO_COLUMN:
            kept[p] = "kept: no row's time depends on it"
            continue
        cols = sens[:, [*chosen, j]] / norms[[*chosen, j]]
        sv = np.linalg.svd(cols, compute_uv=False)
        if len(sv) < len(chosen) + 1 or sv[-1] < _RANK_TOLERANCE:
            others = ", ".join(params[i].name for i in chosen) or "-"
            kept[p] = f"kept: these rows cannot tell it apart from {others}"
            continue
        chosen.append(j)
    return kept


def _fit_group(predictor: Predictor, which: np.ndarray, params: list[_Param],
               base: Calibration, keys: Sequence[str]) -> tuple[dict[_Param, float],
                                                               dict[_Param, str],
                                                               dict[_Param, float]]:
    """Fit ``params`` on the rows of ``which``: (values, kept -> why, stderr)."""
    base_values = {p: p.base(base) for p in params}
    if not which.any() or not params:
        return base_values, dict.fromkeys(params, "kept: no rows"), {}
    measured = np.log(predictor.measured[which])

    def solve(free: list[_Param], start_from: dict[_Param, float]) -> dict[_Param, float]:
        if not free:
            return dict(start_from)

        def values_of(theta: np.ndarray) -> dict[_Param, float]:
            v = dict(start_from)
            v.update({p: p.from_theta(float(t)) for p, t in zip(free, theta, strict=True)})
            return v

        def residual(theta: np.ndarray) -> np.ndarray:
            if not np.isfinite(theta).all():
                return np.full(measured.size, np.inf)
            cal = _calibration(values_of(theta), base, keys)
            return np.log(predictor.predict(cal, which)[which]) - measured

        def start(efficiency: float | None, phase: float | None,
                  source: dict[_Param, float]) -> np.ndarray:
            out = []
            for p in free:
                v = source.get(p, p.base(base))
                if p.is_phase:
                    v = phase if phase is not None else v
                    v = max(v, 0.25)  # sqrt(phase) = 0 is a stationary point
                elif efficiency is not None:
                    v = efficiency
                out.append(p.to_theta(v))
            return np.array(out)

        defaults = {p: p.base(DEFAULT_CALIBRATION) for p in free}
        starts = [start(None, None, start_from), start(None, None, defaults),
                  start(0.5, 5.0, {}), start(1.0, 50.0, {})]
        unique = [s for i, s in enumerate(starts)
                  if not any(np.allclose(s, t) for t in starts[:i])]
        return values_of(minimize(residual, unique))

    kept = _select(_sensitivity(predictor, which, params, base_values, base, keys), params)
    values = solve([p for p in params if p not in kept], base_values)
    # the active bounds may differ at the fit: check again, refit once if they do
    at_fit = _sensitivity(predictor, which, params, values, base, keys)
    kept_at_fit = _select(at_fit, params)
    if set(kept_at_fit) != set(kept):
        kept = kept_at_fit
        start_from = {p: (base_values[p] if p in kept else values[p]) for p in params}
        values = solve([p for p in params if p not in kept], start_from)
        at_fit = _sensitivity(predictor, which, params, values, base, keys)
    free = [j for j, p in enumerate(params) if p not in kept]
    stderr: dict[_Param, float] = {}
    dof = int(which.sum()) - len(free)
    if free and dof > 0:
        cal = _calibration(values, base, keys)
        r = np.log(predictor.predict(cal, which)[which]) - measured
        jac = at_fit[:, free]
        cov = float(r @ r) / dof * np.linalg.pinv(jac.T @ jac)
        for k, j in enumerate(free):
            p = params[j]
            sd = math.sqrt(max(float(cov[k, k]), 0.0))
            stderr[p] = sd if p.is_phase else sd * values[p]
    for p in kept:
        values[p] = base_values[p]
    return values, kept, stderr


def fit_calibration(rows: Sequence[Timing], topology: Topology, *,
                    source: str = "") -> FitResult:
    """Fit link efficiencies and phase costs (and compute efficiencies when GEMM rows are
    present) to ``rows`` on ``topology``'s machines (module docstring).

    ``source`` becomes the fitted calibration's ``source``.  Raises UsageError when a
    row does not fit the topology (:class:`Predictor`).
    """
    if not rows:
        raise UsageError("no timing rows to fit")
    base = topology.calibration
    predictor = Predictor(rows, topology)
    keys = predictor.link_keys
    link_params = ([_Param(k, "efficiency") for k in keys]
                   + [_Param(k, "phase_us") for k in keys])
    compute_params = [_Param("compute", "hbm_efficiency"), _Param("compute", "flops_efficiency")]

    values: dict[_Param, float] = {}
    kept: dict[_Param, str] = {}
    stderr: dict[_Param, float] = {}
    a2a = ~predictor.is_gemm
    for which, params in ((a2a, link_params), (predictor.is_gemm, compute_params)):
        if not which.any():
            if params is compute_params:
                values.update({p: p.base(base) for p in params})
                kept.update(dict.fromkeys(params, "kept: no expert_gemm rows"))
            continue
        v, k, s = _fit_group(predictor, which, params, base, keys)
        values.update(v)
        kept.update(k)
        stderr.update(s)

    fitted_keys = [k for k in keys
                   if any(p not in kept for p in link_params if p.key == k)]
    calibration = _calibration(values, base, fitted_keys, source)
    before = predictor.predict(base)
    after = predictor.predict(_calibration(values, base, keys))
    parameters = []
    shown = [_Param(k, f) for k in keys for f in ("efficiency", "phase_us")] + compute_params
    for p in shown:
        note = kept.get(p, "")
        if not note and not p.is_phase and values[p] >= _MAX_EFFICIENCY * (1 - 1e-6):
            note = f"at the upper bound {_MAX_EFFICIENCY:g}: the nominal figure looks too low"
        parameters.append(FittedParameter(
            p.name, p.base(base), values[p], p not in kept, stderr.get(p), note))
    row_fits = tuple(
        RowFit(r, r.measured_us, float(b), float(a))
        for r, b, a in zip(predictor.rows, before, after, strict=True)
    )
    return FitResult(base, calibration, tuple(parameters), row_fits)

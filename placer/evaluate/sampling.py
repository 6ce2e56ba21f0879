"""Top-k sets sampled from aggregated statistics, when no per-token trace is at hand.

**Target.**  In a window and layer with load ``load[e]`` (selections), each sampled token
picks ``top_k`` distinct experts, and expert ``e`` is among a token's picks with
probability ``pi[e] = top_k * load[e] / sum(load)``: its measured selection frequency
``load[e] / tokens`` when every token selects ``top_k`` experts.  A frequency above 1
cannot be met by distinct picks (it comes from inconsistent data, such as synthetic
marginals): it is capped at 1 and the excess spread over the uncapped experts in
proportion to their load, repeatedly, until none is above 1 (``sum(pi) == top_k``).
With fewer than ``top_k`` loaded experts every token picks all of them (-1 pads).

**Systematic sampling.**  Lay the experts in some order on ``[0, top_k)``, expert ``e``
owning an interval of length ``pi[e]``; draw ``u`` uniform in ``[0, 1)`` and pick the
experts whose intervals hold the points ``u, u + 1, ..., u + top_k - 1`` (Madow's
systematic sampling with unequal probabilities).  As ``pi[e] <= 1`` no interval holds two
points: the picks are distinct, and ``P(e picked) = pi[e]`` exactly, in any order.  The
order is random (drawn afresh for each of a window and layer's mixture components),
which spreads the joint picks as randomized systematic sampling does (Goodman and Kish;
Hartley and Rao).  Successive draws in proportion to load would not do: they flatten the
marginals, and an expert picked by most tokens comes out well below its load.

**Co-activation (anchor mixture).**  With co-activation counts ``coact`` (same-token
pairs over all windows), a token first draws an *anchor* ``a`` with probability
``pi[a] / top_k``, keeps it, and fills the other ``top_k - 1`` picks by systematic
sampling over the *companion* probabilities ``c[a, e] ~ P(e picked | a picked) =
coact[a, e] / load_all[a]``.  For a token with exactly ``top_k`` picks::

    sum over a != e of (pi[a] / top_k) P(e | a) = sum over a != e of P(a, e) / top_k
                                                = (top_k - 1) pi[e] / top_k

so ``P(e picked) = pi[e] / top_k + (top_k - 1) pi[e] / top_k = pi[e]``: the mixture keeps
the marginals.  Pairs with the anchor are reproduced exactly (for ``top_k = 2`` every pair
is), and pairs among companions follow the anchor's row, so experts that co-occur with
the same experts co-occur in the samples.  Where the counts are partial (thresholded
pair lists), a companion row is short of ``top_k - 1``; its deficit is spread over the
experts whose pair with the anchor is unknown, in proportion to ``pi``.

**Calibration.**  The co-activation is counted over all windows while ``pi`` is the
window's, and caps and fills bend the rows, so the companion rows are calibrated by a
fixed-point iteration on columns: the mixture's inclusion probabilities are known in
closed form (``pi[e] / top_k + sum over a of (pi[a] / top_k) c[a, e]``, as systematic
sampling is exact), each column is scaled by its target over its achieved companion
share, and each row is re-capped to sum ``top_k - 1`` with entries at most 1.  An expert
with ``pi = 1`` must be a companion of every anchor: its column is set to 1.  What is
left after ``SAMPLING_CALIBRATION_ROUNDS`` rounds is made exact by mixing in the least
share ``eta`` of plain systematic sampling (no co-activation) whose inclusion
probabilities ``v = (pi - (1 - eta) m) / eta`` (``m``: the mixture's) lie in ``[0, 1]``.
``eta`` (``TopKSampler.correction``) is 0 when the calibration converged; it is 1 without
co-activation.

**Positions.**  Aggregated statistics do not say in which order a token lists its
experts, which the ``round_robin`` policy reads (``k_position``).  Engines list a token's
experts by gate score, and hot experts tend to come first, so each token's picks are
listed in a Plackett-Luce order with weights ``pi`` (an exponential race: expert ``e``
finishes at ``Exp(1) / pi[e]``); with many tokens the order is drawn once per table
cell.

**Speed.**  Within one order the picks change only where ``u`` crosses the fractional
part of an interval start, so the ``experts`` segments of ``u`` and their sets are
enumerated once per window and layer (a table of ``orders x experts`` sets, each with
its probability).  A token then costs one lookup in the table's cumulative
probabilities (a guide table) and a row copy.  A window drawing fewer tokens than the
table has sets looks each token's points up in its order instead (binary searches on
keys sorted by order and ``u``).  Nothing is redrawn or rejected.  Orders: one per
anchor (at least ``SAMPLING_ORDERINGS`` in all), ``SAMPLING_ORDERINGS`` without
co-activation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placer import constants

#: Companion weight every loaded expert keeps, relative to ``pi``: a row always has enough
#: candidates to sum to ``top_k - 1``.
_FLOOR = 1e-9
#: Inclusion probabilities at or above this are certain (``pi = 1``).
_CERTAIN = 1.0 - 1e-12
#: Forward steps of the guide-table lookup before a binary search finishes the rest.
_GUIDE_STEPS = 4


@dataclass(frozen=True)
class TopKSampler:
    """A mixture of systematic samplers over randomly ordered experts (see module).

    Row ``r`` lays the loaded experts in the order ``order[r]`` on ``[0, picks)``, the
    expert at position ``j`` owning ``[start[r, j], start[r, j + 1])`` (the last up to
    ``picks``).  A token draws row ``r`` with probability ``weight[r]`` and ``u`` uniform
    in ``[0, 1)``, and picks the experts holding the points ``u, u + 1, ...,
    u + picks - 1``, listed in a Plackett-Luce order by ``inclusion`` (see module).

    Attributes
    ----------
    order: ``[rows, n]`` int32 expert id at each position of each row.
    start: ``[rows, n]`` float64 start of each position's interval (``start[:, 0] == 0``).
    weight: ``[rows]`` float64 probability of each row (sums to 1).
    inclusion: ``[experts]`` float64 target inclusion probability ``pi`` of each expert.
    top_k: columns of a sample.
    picks: columns filled, ``min(top_k, loaded experts)``; each row sums to it.
    correction: share ``eta`` of plain systematic sampling mixed in to make the marginals
        exact (0: the co-activation mixture alone; 1: co-activation not used).
    """

    order: np.ndarray
    start: np.ndarray
    weight: np.ndarray
    inclusion: np.ndarray
    top_k: int
    picks: int
    correction: float

    @property
    def marginals(self) -> np.ndarray:
        """``[experts]`` float64 inclusion probabilities of the mixture, computed exactly."""
        out = np.zeros(self.inclusion.size)
        if self.order.size:
            length = np.diff(self.start, axis=1, append=float(self.picks))
            np.add.at(out, self.order.ravel(), (self.weight[:, None] * length).ravel())
        return out

    def sample(self, num_tokens: int, rng: np.random.Generator) -> np.ndarray:
        """``[num_tokens, top_k]`` int64 expert ids of independent tokens, -1 where none.

        With many tokens (at least the ``rows x n`` segments), every row's segments are
        enumerated once and each token costs one table lookup; with fewer, each token's
        points are looked up in its row directly.
        """
        out = np.full((num_tokens, self.top_k), -1, dtype=np.int64)
        picks = self.picks
        if picks == 0 or num_tokens == 0:
            return out
        if num_tokens >= self.order.size:
            sets, cdf = _enumerate(self)
            sets = _ranked(sets, self.inclusion, rng)
            out[:, :picks] = sets[_lookup(cdf, rng.random(num_tokens))]
        else:
            cdf = np.cumsum(self.weight)
            row = _lookup(cdf / cdf[-1], rng.random(num_tokens))
            ids = _points(self, row, rng.random(num_tokens))
            out[:, :picks] = _ranked(ids, self.inclusion, rng)
        return out


def _ranked(ids: np.ndarray, inclusion: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each row of ``ids`` (``[m, picks]``, distinct experts) in a Plackett-Luce order with
    weights ``inclusion``: an exponential race, expert e finishing at ``Exp(1) / pi[e]``."""
    finish = rng.standard_exponential(ids.shape) / inclusion[ids]
    out: np.ndarray = np.take_along_axis(ids, np.argsort(finish, axis=1), axis=1)
    return out


def _lookup(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``[len(u)]`` int64 index ``i`` with ``cdf[i - 1] <= u < cdf[i]`` (``cdf[-1] == 1``).

    A guide table (bucket ``j`` of ``len(cdf)`` equal buckets starts at the first index
    whose CDF passes ``j / len(cdf)``) and a short forward walk; a binary search for the
    few points still unresolved after ``_GUIDE_STEPS`` steps.
    """
    size = cdf.size
    last = size - 1
    guide = np.searchsorted(cdf, np.arange(size) / size, side="right")
    idx = guide[np.minimum((u * size).astype(np.int64), last)]
    todo = np.flatnonzero(cdf[np.minimum(idx, last)] <= u)
    for _ in range(_GUIDE_STEPS):
        if todo.size == 0:
            break
        idx[todo] += 1
        todo = todo[cdf[np.minimum(idx[todo], last)] <= u[todo]]
    if todo.size:
        idx[todo] = np.searchsorted(cdf, u[todo], side="right")
    out: np.ndarray = np.minimum(idx, last)
    return out


def _enumerate(sampler: TopKSampler) -> tuple[np.ndarray, np.ndarray]:
    """Every row's segments of u with their sets: ``[cells, picks]`` int32 expert ids
    and ``[cells]`` float64 CDF (see module, Speed)."""
    num_rows, n = sampler.order.shape
    picks = sampler.picks
    later = sampler.start[:, 1:]
    slot = np.minimum(np.floor(later), picks - 1)
    frac = later - slot
    by_frac = np.argsort(frac, axis=1, kind="stable")
    frac = np.take_along_axis(frac, by_frac, axis=1)
    slot = np.take_along_axis(slot.astype(np.int32), by_frac, axis=1)
    # in segment s (u between the s-th and s+1-th smallest frac) the position at point i
    # is (starts in slots below i) + (starts in slot i among the first s by frac)
    passed = np.zeros((num_rows, picks, n), dtype=np.int32)
    point = np.arange(picks, dtype=np.int32)[None, :, None]
    np.cumsum(point == slot[:, None, :], axis=2, out=passed[:, :, 1:])
    in_slot = np.bincount(
        (slot + (np.arange(num_rows) * picks)[:, None].astype(np.int32)).ravel(),
        minlength=num_rows * picks,
    ).reshape(num_rows, picks)
    below = np.cumsum(in_slot, axis=1) - in_slot
    passed += (below + (np.arange(num_rows) * n)[:, None]).astype(np.int32)[:, :, None]
    edges = np.concatenate(
        [np.zeros((num_rows, 1)), np.minimum(frac, 1.0), np.ones((num_rows, 1))], axis=1
    )
    prob = (sampler.weight[:, None] * np.clip(np.diff(edges, axis=1), 0.0, None)).ravel()
    keep = np.flatnonzero(prob > 0)
    cdf = np.cumsum(prob[keep])
    cdf /= cdf[-1]
    cells = passed.transpose(0, 2, 1).reshape(-1, picks)[keep]
    return sampler.order.ravel()[cells], cdf


def _points(sampler: TopKSampler, row: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``[tokens, picks]`` int32 expert ids at the points of tokens with rows ``row``.

    Every row's starts form one increasing array (row r shifted by ``r * (picks + 1)``);
    with the tokens taken in order of ``(row, u)`` each column's keys increase too, which
    makes the binary searches cheap.
    """
    num_rows = sampler.order.shape[0]
    picks = sampler.picks
    offset = np.arange(num_rows, dtype=np.float64) * (picks + 1)
    starts = (sampler.start + offset[:, None]).ravel()
    by_key = np.argsort(row + u)
    row, u = row[by_key], u[by_key]
    keys = (offset[row] + u)[:, None] + np.arange(picks)  # [tokens, picks]
    pos = np.empty(keys.shape, dtype=np.int64)
    for c in range(picks):
        pos[:, c] = np.searchsorted(starts, keys[:, c], side="right") - 1
    out = np.empty(keys.shape, dtype=np.int32)
    out[by_key] = sampler.order.ravel()[pos]
    return out


def target_inclusion(load: np.ndarray, top_k: int) -> np.ndarray:
    """``[experts]`` float64 inclusion probabilities ``pi`` (see module: capped at 1).

    Parameters
    ----------
    load: ``[experts]`` non-negative selections (tokens) of the window and layer.
    top_k: experts a token selects; ``sum(pi) == min(top_k, loaded experts)``.
    """
    weights = np.clip(np.asarray(load, dtype=np.float64), 0.0, None)
    picks = min(top_k, int(np.count_nonzero(weights > 0)))
    if picks == 0:
        return np.zeros(weights.size)
    return _capped(weights[None], float(picks))[0]


def _capped(weights: np.ndarray, total: float, held: np.ndarray | None = None) -> np.ndarray:
    """Rows of ``weights`` (``[rows, n]``) scaled to sum ``total`` with no entry above 1.

    Entries that would exceed 1 are set to 1 and the others scaled up to make the sum,
    until none exceeds 1 (a row needs at least ``total`` positive entries).  Entries
    where ``held`` (``[rows, n]`` bool) is true are 1 from the start.
    """
    weights = np.asarray(weights, dtype=np.float64)
    sums = weights.sum(axis=1, keepdims=True)
    out = weights * np.divide(total, sums, out=np.zeros_like(sums), where=sums > 0)
    if held is None:  # rows where plain scaling keeps every entry at most 1 are done
        redo = np.flatnonzero(out.max(axis=1, initial=0.0) > 1.0)
        capped = np.zeros((redo.size, weights.shape[1]), dtype=bool)
    else:
        redo = np.arange(weights.shape[0])
        capped = held.copy()
    if redo.size == 0:
        return out
    part = weights[redo]
    for _ in range(weights.shape[1] + 1):
        free = np.where(capped, 0.0, part)
        room = total - capped.sum(axis=1, keepdims=True)
        sums = free.sum(axis=1, keepdims=True)
        scale = np.divide(room, sums, out=np.zeros_like(sums), where=sums > 0)
        fitted = np.where(capped, 1.0, free * scale)
        over = (fitted > 1.0) & ~capped
        if not over.any():
            break
        capped |= over
    out[redo] = fitted
    return out


def companion_rows(
    coact: np.ndarray, load_all: np.ndarray, inclusion: np.ndarray, top_k: int
) -> tuple[np.ndarray, float]:
    """Calibrated companion probabilities of the anchor mixture (see module).

    Parameters
    ----------
    coact: ``[n, n]`` same-token pair counts of the layer over all windows.
    load_all: ``[n]`` load of the layer over all windows.
    inclusion: ``[n]`` target ``pi`` of the window, all positive, ``sum == top_k``,
        at least ``top_k + 1`` entries.

    Returns
    -------
    rows: ``[n, n]`` float64; row ``a`` holds ``c[a, e]``, zero diagonal, entries in
        ``[0, 1]``, each row summing to ``top_k - 1``.
    error: largest ``|achieved - pi|`` over experts of the mixture with these rows.
    """
    n = inclusion.size
    k1 = top_k - 1
    pi = inclusion
    load_all = np.asarray(load_all, dtype=np.float64)
    inverse = np.divide(1.0, load_all, out=np.zeros(n), where=load_all > 0)
    rows = np.asarray(coact, dtype=np.float64) * inverse[:, None]
    np.fill_diagonal(rows, 0.0)
    np.clip(rows, 0.0, 1.0, out=rows)
    # Step 1: spread each row's missing pair mass over the anchor's unknown pairs, by pi
    deficit = np.clip(k1 - rows.sum(axis=1), 0.0, None)
    short = np.flatnonzero(deficit > 0)
    if short.size:
        prior = np.where(rows[short] == 0, pi[None, :], 0.0)
        prior[np.arange(short.size), short] = 0.0
        mass = prior.sum(axis=1)
        if (mass <= 0).any():  # every pair known: spread over all the others
            prior[mass <= 0] = pi[None, :]
            prior[np.arange(short.size), short] = 0.0
            mass = prior.sum(axis=1)
        rows[short] += prior * (deficit[short] / mass)[:, None]
    rows += _FLOOR * pi[None, :]
    np.fill_diagonal(rows, 0.0)
    # Step 2: an expert in every token is a companion of every other anchor
    certain = pi >= _CERTAIN
    held = None
    if certain.any():
        held = np.broadcast_to(certain[None, :], (n, n)).copy()
        np.fill_diagonal(held, False)
    # Step 3: scale columns to their companion share and re-cap the rows, until it holds
    weight = pi / top_k
    target = pi * k1 / top_k
    rows = _capped(rows, float(k1), held)
    for _ in range(constants.SAMPLING_CALIBRATION_ROUNDS):
        achieved = weight @ rows
        if np.abs(achieved - target).max() <= constants.SAMPLING_CALIBRATION_TOL:
            break
        scale = np.divide(target, achieved, out=np.ones(n), where=achieved > 0)
        rows = _capped(rows * scale[None, :], float(k1), held)
    return rows, float(np.abs(weight @ rows - target).max())


def build_sampler(
    load: np.ndarray,
    top_k: int,
    rng: np.random.Generator,
    *,
    coact: np.ndarray | None = None,
    load_all: np.ndarray | None = None,
) -> TopKSampler:
    """The sampler of one window and layer (see module).

    Parameters
    ----------
    load: ``[experts]`` non-negative load of the window and layer (tokens).
    top_k: experts a token selects.
    rng: draws the orders and rotations.
    coact: ``[experts, experts]`` same-token pair counts over all windows, or None.
    load_all: ``[experts]`` load over all windows (the load ``coact`` was counted
        with); ``load`` when None.
    """
    pi = target_inclusion(load, top_k)
    active = np.flatnonzero(pi > 0)
    n = active.size
    picks = min(top_k, n)
    if picks == 0:
        empty = np.zeros((1, 0))
        return TopKSampler(empty.astype(np.int32), empty, np.ones(1), pi, top_k, 0, 1.0)
    # Step 1: the mixture's components (inclusion rows over the loaded experts)
    incl, weight, eta = _components(pi[active], top_k, coact, load, load_all, active)
    # Step 2: a random order per row (unused experts first: empty intervals at 0)
    keys = rng.random(incl.shape)
    keys[incl <= 0] = -1.0
    order = np.argsort(keys, axis=1)
    length = np.take_along_axis(incl, order, axis=1)
    start = np.cumsum(length, axis=1) - length
    start[:, 0] = 0.0
    return TopKSampler(active.astype(np.int32)[order], start, weight / weight.sum(), pi,
                       top_k, picks, eta)


def _components(
    pi: np.ndarray, top_k: int, coact: np.ndarray | None, load: np.ndarray,
    load_all: np.ndarray | None, active: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Inclusion rows ``[rows, n]``, their probabilities ``[rows]`` and ``eta``.

    Anchor rows (``max(1, SAMPLING_ORDERINGS // n)`` orders per anchor) with weight
    ``(1 - eta) pi[a] / top_k``; then ``ceil(eta * SAMPLING_ORDERINGS)`` plain rows
    sharing ``eta``.
    """
    n = pi.size
    picks = min(top_k, n)
    rows: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    eta = 1.0
    mixed = np.zeros(n)
    if coact is not None and top_k > 1 and n > top_k:
        base = np.asarray(load if load_all is None else load_all)[active]
        companions, _ = companion_rows(np.asarray(coact)[np.ix_(active, active)], base, pi,
                                       top_k)
        anchors = companions + np.eye(n)
        anchor_weight = pi / top_k
        mixed = anchor_weight @ anchors
        eta = _correction_share(pi, mixed)
        if eta < 1.0:
            per = max(1, constants.SAMPLING_ORDERINGS // n)
            rows.append(np.repeat(anchors, per, axis=0))
            weights.append(np.repeat(anchor_weight * (1.0 - eta) / per, per))
    if eta > 0.0:
        plain = pi if eta >= 1.0 else np.clip(pi - (1.0 - eta) * mixed, 0.0, None) / eta
        per = max(1, int(np.ceil(eta * constants.SAMPLING_ORDERINGS)))
        rows.append(np.repeat(_capped(plain[None], float(picks)), per, axis=0))
        weights.append(np.full(per, eta / per))
    return np.vstack(rows), np.concatenate(weights), eta


def _correction_share(pi: np.ndarray, mixed: np.ndarray) -> float:
    """Least ``eta`` with ``(pi - (1 - eta) mixed) / eta`` in ``[0, 1]`` (see module)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.where(mixed > pi, 1.0 - pi / mixed, 0.0)
        under = np.where((mixed < pi) & (mixed < 1.0), (pi - mixed) / (1.0 - mixed), 0.0)
    eta = float(max(over.max(), under.max(), 0.0))
    if not np.isfinite(eta):
        return 1.0
    return 0.0 if eta <= constants.SAMPLING_CALIBRATION_TOL * 1e-3 else min(eta, 1.0)


def sample_topk(
    load: np.ndarray,
    num_tokens: int,
    top_k: int,
    rng: np.random.Generator,
    *,
    coact: np.ndarray | None = None,
    load_all: np.ndarray | None = None,
) -> np.ndarray:
    """``[num_tokens, top_k]`` int64 sampled expert ids, -1 where none (see module).

    ``build_sampler(load, top_k, rng, coact=coact, load_all=load_all).sample(num_tokens,
    rng)``.
    """
    sampler = build_sampler(load, top_k, rng, coact=coact, load_all=load_all)
    return sampler.sample(num_tokens, rng)


def sampled_batch_windows(window_range: tuple[int, int], num_batches: int) -> np.ndarray:
    """``[num_batches]`` int64 window each sampled batch is drawn from.

    Batches are spread over the range's windows in order, in equal shares:
    batch ``b`` uses window ``start + (b * num_windows) // num_batches``.
    """
    start, stop = window_range
    b = np.arange(num_batches, dtype=np.int64)
    return start + (b * (stop - start)) // num_batches


@dataclass(frozen=True)
class BatchPlan:
    """Which windows sampled batches are drawn from, and how many tokens each batch has.

    Attributes
    ----------
    groups: ``[(start, stop)]`` window ranges, in time order; each group's summed load is
        sampled as one (a group of one window is that window).
    group_batches: batches drawn from each group (same length as ``groups``, each >= 1);
        batch ``b`` belongs to the group holding the ``b``-th batch in this order.
    batch_tokens: tokens per sampled batch.
    num_batches: ``sum(group_batches)``.
    message: what was merged or shrunk and why (a PlacerWarning's text), or ``""``.
    """

    groups: list[tuple[int, int]]
    group_batches: list[int]
    batch_tokens: int
    num_batches: int
    message: str = ""


def plan_sampled_batches(
    tokens: np.ndarray, window_range: tuple[int, int], num_batches: int, batch_tokens: int
) -> BatchPlan:
    """Spread ``num_batches`` batches of ``batch_tokens`` over windows that hold enough tokens.

    Batch ``b`` starts at window ``start + (b * num_windows) // num_batches``
    (:func:`sampled_batch_windows`).  A window's load is a noisy estimate of its routing
    when it counts few tokens: every batch drawn from it carries that noise on top of
    its own (about ``sqrt(1 + batch_tokens / tokens)`` times a replayed batch's count
    noise), and the per-batch imbalance comes out too high (uniform routing,
    2,048-token windows, 4,096-token batches: batch hot shard p99 1.179 sampled against
    1.098 replayed).  So a window holding fewer tokens than the batches drawn from it
    (``tokens[w] < batch_tokens x batches``) is merged with the windows after it (before
    it, at the end of the range) until the group holds that many.  When the whole range
    holds fewer than ``num_batches x batch_tokens`` tokens, that cannot be met; groups
    then need one batch of tokens each (``tokens >= batch_tokens``) and the batches are
    kept.  With fewer than ``batch_tokens`` tokens in the range, one batch of all of them
    is drawn (a replay would have no more).  Windows that hold enough are sampled on
    their own, exactly as before.

    Parameters
    ----------
    tokens: ``[windows]`` int64 tokens per window (``ExpertStats.tokens``).
    window_range: ``(start, stop)`` windows to sample from.
    num_batches: batches asked for (>= 1).
    batch_tokens: tokens per batch asked for (>= 1).

    Returns
    -------
    A :class:`BatchPlan`; its ``message`` is empty when nothing was changed.
    """
    start, stop = window_range
    counts = np.asarray(tokens, dtype=np.int64)[start:stop]
    total = int(counts.sum())
    notes = []
    if 0 < total < batch_tokens:
        notes.append(
            f"windows {start}:{stop} hold {total:,} tokens, fewer than one batch of"
            f" {batch_tokens:,}: drew 1 batch of {total:,} tokens"
        )
        batch_tokens, num_batches = total, 1
    # tokens a group needs per batch drawn from it, and per group at least
    per_batch = batch_tokens if total >= num_batches * batch_tokens else 0
    num_windows = stop - start
    per_window = np.bincount(sampled_batch_windows((0, num_windows), num_batches),
                             minlength=num_windows)
    groups, group_batches = _group_windows(counts, per_window, per_batch, batch_tokens)
    merged = [(start + a, start + b) for a, b in groups if b - a > 1]
    if merged:
        shown = ", ".join(f"{a}:{b}" for a, b in merged[:4])
        more = f" and {len(merged) - 4} more" if len(merged) > 4 else ""
        held = (f"{batch_tokens:,} tokens per batch drawn from it" if per_batch
                else f"at least one batch of {batch_tokens:,} tokens")
        notes.append(
            f"merged windows {shown}{more} so each sampled group holds {held} (a window"
            " holding fewer adds its own sampling noise to every batch drawn from it and"
            " inflates the per-batch imbalance)"
        )
    message = ""
    if notes:
        message = (
            "sampled batches: " + "; ".join(notes) + ". Use `window_tokens` (windows of"
            " several batches) or a smaller `batch_tokens` to choose yourself"
        )
    return BatchPlan(
        groups=[(start + a, start + b) for a, b in groups],
        group_batches=group_batches,
        batch_tokens=int(batch_tokens),
        num_batches=int(sum(group_batches)),
        message=message,
    )


def _group_windows(counts: np.ndarray, per_window: np.ndarray, per_batch: int,
                   batch_tokens: int) -> tuple[list[tuple[int, int]], list[int]]:
    """``(groups, group_batches)`` of :class:`BatchPlan`, window indices relative to the
    range: each window merged with the ones after it (before it, at the range's end)
    until the group holds ``per_batch`` tokens per batch drawn from it and at least
    ``batch_tokens`` (:func:`plan_sampled_batches`).

    ``counts``: ``[windows]`` tokens of each window; ``per_window``: ``[windows]``
    batches each window starts.
    """
    total = int(counts.sum())
    num_windows = per_window.size

    def enough(have: int, need: int) -> bool:
        return total == 0 or (have >= per_batch * need and have >= batch_tokens)

    groups: list[tuple[int, int]] = []
    group_batches: list[int] = []
    lo = 0
    while lo < num_windows:
        if per_window[lo] == 0:
            lo += 1
            continue
        hi, have, need = lo + 1, int(counts[lo]), int(per_window[lo])
        while not enough(have, need) and hi < num_windows:
            have += int(counts[hi])
            need += int(per_window[hi])
            hi += 1
        while not enough(have, need) and groups:
            # the range's end came first: fold into the group before
            lo, _ = groups.pop()
            need += group_batches.pop()
            have = int(counts[lo:hi].sum())
        groups.append((lo, hi))
        group_batches.append(need)
        lo = hi
    return groups, group_batches

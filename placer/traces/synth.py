"""Synthetic per-token routing traces with controllable skew, clusters, drift and groups.

The generator draws each token's top-k experts of each layer from a Plackett-Luce
model: experts are picked one after another without replacement, each with
probability proportional to its weight among those not yet picked (the law of
"Gumbel-top-k" sampling).  The weights of layer ``l`` for a token at step ``s`` in
co-activation cluster ``c`` are::

    w_e = (1 + r_e(s)) ** -zipf[l]  *  (cluster_boost if cluster_of[l, e] == c else 1)
    r_e(s) = (popularity_rank[l, e] + drift * s) mod E

- *skew*: ``zipf`` is the Zipf exponent of the popularity ranks (0 = uniform);
- *co-activation clusters*: each layer's experts are split at random into ``clusters``
  equal clusters; every token belongs to one cluster index (uniform, the same in all
  layers, like a topic), which multiplies its cluster's weights by ``cluster_boost``:
  experts of one cluster are co-selected more often than chance, and the clusters of
  consecutive layers that share an index show inter-layer affinity;
- *drift*: the popularity order rotates by ``drift`` ranks per step: every expert cools
  gradually, and the coldest one turns hottest (over one rank, linearly in log-weight);
- *group-limited routing* (DeepSeek-V3): experts ``g*E/G .. (g+1)*E/G - 1`` form group
  ``g``; a token first picks ``top_groups`` groups (Plackett-Luce on the groups' total
  weights), then its ``top_k`` experts among the experts of those groups only.

Tokens are numbered ``0..N-1``; token ``t`` runs at step ``t // tokens_per_step`` on
source rank ``(t % tokens_per_step) % num_ranks`` (round-robin over DP ranks).

Sampling is vectorized per chunk of tokens: draws with replacement from each
distribution (inverse CDF through a guide table), keeping the first ``k`` distinct ids;
the few tokens whose draws hold fewer than ``k`` distinct ids finish with an exact
exponential race over the experts left.  Same parameters and seed give the same trace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from placer import constants
from placer.errors import Param, UsageError
from placer.traces.formats.jsonl.write import write_jsonl_trace
from placer.traces.formats.npz import write_npz_trace

if TYPE_CHECKING:
    from placer.model import ModelSpec

__all__ = [
    "SynthChunk",
    "SynthLayout",
    "SynthParams",
    "params_for_model",
    "synth_layout",
    "synthesize",
    "write_synth",
]

#: Guide-table bins per distribution entry (more bins: fewer correction passes).
_GUIDE_BINS_PER_ENTRY = 2
#: Most distinct drift phases within one chunk (steps in a chunk share these).
_MAX_PHASES_PER_CHUNK = 64
#: Draw positions are packed in 6 bits next to the id when removing duplicates.
_MAX_DRAWS = 64


@dataclass(frozen=True)
class SynthParams:
    """What to generate.  Validates itself; bad values raise UsageError naming the option.

    Attributes
    ----------
    num_tokens: tokens to generate (each routed through every layer).
    layer_ids: absolute layer index of each MoE layer, ``[layers]``.
    num_experts: logical experts per layer ``E``.
    top_k: experts selected per token per layer.
    num_groups: expert groups ``G`` for group-limited routing (1 = ungrouped); must
        divide ``E``.
    top_groups: groups a token may use (``<= G``); ``top_groups * E / G >= top_k``.
    zipf: Zipf exponent of expert popularity, one for all layers or one per layer.
    clusters: co-activation clusters per layer (0 = none).
    cluster_boost: weight multiplier of a token's own cluster (> 0; 1 = no effect).
    drift: popularity ranks rotated per step (0 = stationary).
    tokens_per_step: tokens in one forward step (batch).
    num_ranks: data-parallel source ranks; tokens of a step are dealt round-robin.
    weights: also emit ``topk_weights`` (the chosen experts' weights, normalized).
    seed: random seed.
    model: model name written in the header.
    chunk_tokens: tokens generated at a time (memory bound; part of the seed's meaning).
    """

    num_tokens: int = 65_536
    layer_ids: tuple[int, ...] = (0, 1, 2, 3)
    num_experts: int = 64
    top_k: int = 4
    num_groups: int = 1
    top_groups: int = 1
    zipf: float | tuple[float, ...] = 1.0
    clusters: int = 0
    cluster_boost: float = 4.0
    drift: float = 0.0
    tokens_per_step: int = 256
    num_ranks: int = 1
    weights: bool = False
    seed: int = 0
    model: str | None = None
    chunk_tokens: int = constants.SYNTH_CHUNK_TOKENS

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_ids", tuple(int(i) for i in self.layer_ids))
        if isinstance(self.zipf, list | tuple | np.ndarray):
            object.__setattr__(self, "zipf", tuple(float(z) for z in self.zipf))
        else:
            object.__setattr__(self, "zipf", float(self.zipf))
        self._validate()

    def _validate(self) -> None:
        def bad(message: str, option: str, hint: str | None = None) -> UsageError:
            return UsageError(message, where=option, hint=hint)

        e, k = self.num_experts, self.top_k
        if self.num_tokens < 1:
            raise bad(f"expected at least 1 token, got {self.num_tokens}", Param("tokens"))
        if not self.layer_ids:
            raise bad("expected at least one layer", Param("layers"))
        if len(set(self.layer_ids)) != len(self.layer_ids) or min(self.layer_ids) < 0:
            raise bad(
                f"layer ids must be distinct and >= 0, got {list(self.layer_ids)}", Param("layers")
            )
        if not 2 <= e <= constants.SYNTH_MAX_EXPERTS:
            raise bad(
                f"expected 2 to {constants.SYNTH_MAX_EXPERTS} experts, got {e}", Param("experts")
            )
        if not 1 <= k <= min(e - 1, constants.SYNTH_MAX_TOP_K):
            raise bad(
                f"expected top-k in [1, {min(e - 1, constants.SYNTH_MAX_TOP_K)}] for {e} "
                f"experts, got {k}",
                Param("top_k"),
            )
        if self.num_groups < 1 or e % self.num_groups:
            raise bad(
                f"groups must divide the {e} experts, got {self.num_groups}",
                Param("groups"),
                hint="DeepSeek-V3 uses 8 groups of 32 experts",
            )
        if not 1 <= self.top_groups <= self.num_groups:
            raise bad(
                f"expected top groups in [1, {self.num_groups}], got {self.top_groups}",
                Param("top_groups"),
            )
        if self.top_groups * (e // self.num_groups) < k:
            raise bad(
                f"{self.top_groups} groups of {e // self.num_groups} experts cannot hold "
                f"top-{k}",
                Param("top_groups"),
                hint="raise `top_groups` or lower `top_k`",
            )
        zipf = self.zipf_per_layer()
        if zipf.shape != (len(self.layer_ids),):
            raise bad(
                f"expected one Zipf exponent or {len(self.layer_ids)} (one per layer), "
                f"got {zipf.size}",
                Param("zipf"),
            )
        if not np.isfinite(zipf).all() or (zipf < 0).any():
            raise bad(f"Zipf exponents must be finite and >= 0, got {zipf.tolist()}", Param("zipf"))
        if self.clusters < 0 or self.clusters > e:
            raise bad(f"expected 0 to {e} clusters, got {self.clusters}", Param("clusters"))
        if not (math.isfinite(self.cluster_boost) and self.cluster_boost > 0):
            raise bad(f"cluster boost must be > 0, got {self.cluster_boost}",
                      Param("cluster_boost"))
        if not (math.isfinite(self.drift) and self.drift >= 0):
            raise bad(f"drift must be >= 0 ranks per step, got {self.drift}", Param("drift"))
        if self.tokens_per_step < 1:
            raise bad(f"expected at least 1 token per step, got {self.tokens_per_step}",
                      Param("tokens_per_step"))
        if self.num_ranks < 1:
            raise bad(f"expected at least 1 rank, got {self.num_ranks}", Param("ranks"))
        if self.chunk_tokens < 1:
            raise bad(f"expected chunks of at least 1 token, got {self.chunk_tokens}",
                      "chunk_tokens")

    @property
    def num_layers(self) -> int:
        return len(self.layer_ids)

    def zipf_per_layer(self) -> np.ndarray:
        """``[layers]`` float64 Zipf exponent of each layer."""
        if isinstance(self.zipf, tuple):
            return np.asarray(self.zipf, dtype=np.float64)
        return np.full(len(self.layer_ids), float(self.zipf))

    def header(self) -> dict[str, Any]:
        """Trace metadata: the header fields of docs/traces.md, then ``synth_*`` generator settings.

        Flat scalars (and the per-layer Zipf list), so both the JSONL header and the
        NPZ scalar members can hold them.
        """
        head: dict[str, Any] = {
            "model": self.model or "synthetic",
            "num_layers": self.num_layers,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "synthetic": True,
            "generator": "placer.traces.synth",
        }
        for key, value in asdict(self).items():
            if key in ("layer_ids", "model", "num_experts", "top_k", "chunk_tokens"):
                continue
            head[f"synth_{key}"] = list(value) if isinstance(value, tuple) else value
        head["synth_chunk_tokens"] = self.chunk_tokens
        return head


def params_for_model(model: ModelSpec, **overrides: Any) -> SynthParams:
    """SynthParams with a model preset's shape.

    Takes ``moe_layer_ids``, ``num_experts``, ``top_k``, ``num_groups``, ``top_groups``
    and ``name`` from ``model``; keyword ``overrides`` win over them.
    """
    base: dict[str, Any] = {
        "layer_ids": tuple(model.moe_layer_ids),
        "num_experts": int(model.num_experts),
        "top_k": int(model.top_k),
        "num_groups": int(model.num_groups or 1),
        "top_groups": int(model.top_groups or 1),
        "model": str(model.name),
    }
    base.update({k: v for k, v in overrides.items() if v is not None})
    return SynthParams(**base)


@dataclass(frozen=True)
class SynthLayout:
    """The fixed, seeded structure of a synthetic trace.

    Attributes
    ----------
    popularity_rank: ``[layers, experts]`` int64, rank of each expert at step 0
        (0 = hottest).
    cluster_of: ``[layers, experts]`` int64, co-activation cluster of each expert
        (all -1 without clusters).
    """

    popularity_rank: np.ndarray
    cluster_of: np.ndarray


def synth_layout(params: SynthParams) -> SynthLayout:
    """Popularity ranks and clusters of ``params``, drawn from its seed."""
    rng = np.random.default_rng(np.random.SeedSequence(params.seed, spawn_key=(0,)))
    n_layers, e = params.num_layers, params.num_experts
    rank = np.empty((n_layers, e), dtype=np.int64)
    cluster = np.full((n_layers, e), -1, dtype=np.int64)
    for row in range(n_layers):
        rank[row, rng.permutation(e)] = np.arange(e)
        if params.clusters:
            cluster[row, rng.permutation(e)] = np.arange(e) % params.clusters
    return SynthLayout(popularity_rank=rank, cluster_of=cluster)


@dataclass(frozen=True)
class SynthChunk:
    """Consecutive synthetic tokens ``start .. start + tokens - 1``.

    Attributes
    ----------
    start: index of the first token.
    topk_ids: ``[tokens, layers, k]`` int16 logical expert ids (distinct per row).
    step: ``[tokens]`` int64 forward step of each token.
    rank: ``[tokens]`` int64 source rank of each token.
    topk_weights: ``[tokens, layers, k]`` float32 normalized weights, or None.
    """

    start: int
    topk_ids: np.ndarray
    step: np.ndarray
    rank: np.ndarray
    topk_weights: np.ndarray | None = None


def synthesize(params: SynthParams) -> Iterator[SynthChunk]:
    """Generate the trace of ``params`` chunk by chunk (at most ``chunk_tokens`` each)."""
    layout = synth_layout(params)
    zipf = params.zipf_per_layer()
    for index, start in enumerate(range(0, params.num_tokens, params.chunk_tokens)):
        stop = min(start + params.chunk_tokens, params.num_tokens)
        rng = np.random.default_rng(np.random.SeedSequence(params.seed, spawn_key=(1, index)))
        yield _chunk(params, layout, zipf, start, stop, rng)


# -- one chunk ---------------------------------------------------------------------------


def _chunk(
    params: SynthParams,
    layout: SynthLayout,
    zipf: np.ndarray,
    start: int,
    stop: int,
    rng: np.random.Generator,
) -> SynthChunk:
    n = stop - start
    token = np.arange(start, stop, dtype=np.int64)
    step = token // params.tokens_per_step
    rank = (token % params.tokens_per_step) % params.num_ranks
    # Step 1: each token's distribution index d = phase * n_clusters + cluster.
    n_clusters = max(params.clusters, 1)
    cluster = rng.integers(0, n_clusters, size=n) if params.clusters else np.zeros(n, np.int64)
    phases, phase_of = _phases(params, step)
    dist = phase_of * n_clusters + cluster
    k = params.top_k
    ids = np.empty((n, params.num_layers, k), dtype=np.int16)
    weights = np.empty((n, params.num_layers, k), dtype=np.float32) if params.weights else None
    for row in range(params.num_layers):
        # Step 2: expert weights of every distribution of this layer, [D, E].
        w = _weights(layout, row, zipf[row], phases, params, n_clusters)
        chosen = _route(w, dist, params, rng)
        ids[:, row] = chosen
        if weights is not None:
            picked = np.take_along_axis(w[dist], chosen, axis=1)
            weights[:, row] = picked / picked.sum(axis=1, keepdims=True)
    return SynthChunk(start=start, topk_ids=ids, step=step, rank=rank, topk_weights=weights)


def _phases(params: SynthParams, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drift phases (ranks) used in this chunk ``[P]`` and each token's phase index."""
    if params.drift == 0:
        return np.zeros(1), np.zeros(step.size, dtype=np.int64)
    s0, s1 = int(step[0]), int(step[-1])
    n_steps = s1 - s0 + 1
    n_phases = min(n_steps, _MAX_PHASES_PER_CHUNK)
    phase_of = (step - s0) * n_phases // n_steps
    first_step = s0 + np.ceil(np.arange(n_phases) * n_steps / n_phases)
    return params.drift * first_step, phase_of


def _weights(
    layout: SynthLayout,
    row: int,
    zipf: float,
    phases: np.ndarray,
    params: SynthParams,
    n_clusters: int,
) -> np.ndarray:
    """``[phases * clusters, experts]`` float64 weights of one layer."""
    e = params.num_experts
    r = np.mod(layout.popularity_rank[row][None, :] + phases[:, None], e)  # [P, E]
    log_w = -zipf * np.log1p(np.minimum(r, e - 1))
    # Between rank E-1 and E the coldest expert ramps up to the hottest's weight.
    ramp = np.clip(r - (e - 1), 0.0, 1.0)
    log_w = log_w * (1.0 - ramp)
    w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    if params.clusters:
        boost = np.where(
            layout.cluster_of[row][None, :] == np.arange(n_clusters)[:, None],
            params.cluster_boost,
            1.0,
        )  # [C, E]
        w = (w[:, None, :] * boost[None, :, :]).reshape(-1, e)
    return w


def _route(
    w: np.ndarray, dist: np.ndarray, params: SynthParams, rng: np.random.Generator
) -> np.ndarray:
    """Top-k experts ``[tokens, k]`` of each token under group-limited Plackett-Luce.

    One sequence of i.i.d. draws from ``w[dist]`` per token serves both stages: the
    first ``top_groups`` distinct groups of the sequence are a Plackett-Luce draw of
    groups by total weight; the draws after the one that completed the groups are
    i.i.d. again, and those inside the chosen groups are draws from the restricted law,
    whose first ``k`` distinct ids are the token's experts.
    """
    n, e = dist.size, params.num_experts
    n_groups, m, k = params.num_groups, params.top_groups, params.top_k
    per_group = e // n_groups
    grouped = n_groups > 1
    n_draws = min(2 * k + 8 + (3 * m if grouped else 0), _MAX_DRAWS)
    u = rng.random((n, n_draws))
    draws = _inverse_cdf(w, np.broadcast_to(dist[:, None], u.shape), u)
    allowed = np.ones((n, n_groups), dtype=bool)
    valid = None
    groups_found = np.full(n, m)
    if grouped:
        # Step 3: the first m distinct groups, and the draw that completed them.
        group_of = draws // per_group
        group_first = _first_mask(group_of, n_groups)
        seen = np.cumsum(group_first, axis=1)
        groups_found = np.minimum(seen[:, -1], m)
        done_at = np.argmax(seen >= m, axis=1)
        allowed = np.zeros((n, n_groups), dtype=bool)
        r_idx, c_idx = np.nonzero(group_first & (seen <= m))
        allowed[r_idx, group_of[r_idx, c_idx]] = True
        after = np.arange(n_draws)[None, :] > done_at[:, None]
        valid = after & np.take_along_axis(allowed, group_of, axis=1)
        valid &= (groups_found == m)[:, None]
        short_groups = np.flatnonzero(groups_found < m)
        if short_groups.size:
            # Rare: the draws held fewer than m groups; finish the groups by a race.
            group_w = w[dist[short_groups]].reshape(-1, n_groups, per_group).sum(axis=2)
            # The groups found so far come first (ascending id); the rest is ignored.
            have = np.argsort(~allowed[short_groups], axis=1, kind="stable")[:, :m]
            full = _finish_race(
                group_w, np.ones_like(group_w, dtype=bool), have, groups_found[short_groups], rng
            )
            sub = np.zeros((short_groups.size, n_groups), dtype=bool)
            np.put_along_axis(sub, full, True, axis=1)
            allowed[short_groups] = sub
    # Step 4: the first k distinct experts among the valid draws.
    chosen, found = _first_distinct(draws, k, e, valid)
    # Step 5: tokens short of k experts finish with an exact exponential race.
    short = np.flatnonzero(found < k)
    if short.size:
        allowed_e = np.repeat(allowed[short], per_group, axis=1)
        chosen[short] = _finish_race(w[dist[short]], allowed_e, chosen[short], found[short], rng)
    return chosen


def _first_mask(ids: np.ndarray, size: int, valid: np.ndarray | None = None) -> np.ndarray:
    """``[N, M]`` bool: True where a row's id (in ``0..size-1``) first appears, in row order.

    Draws where ``valid`` is False are ignored (never first, and do not hide later copies).
    """
    n, m = ids.shape
    if valid is not None:
        # Ignored draws get ids no real draw has, one per position.
        ids = np.where(valid, ids, size + np.arange(m))
    pos_bits = 6
    # Sorting (id, position) pairs puts each id's first occurrence first among its copies.
    packed = (ids.astype(np.int64) << pos_bits) | np.arange(m)
    packed.sort(axis=1)
    sorted_ids = packed >> pos_bits
    first_sorted = np.ones((n, m), dtype=bool)
    first_sorted[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    first = np.empty((n, m), dtype=bool)
    np.put_along_axis(first, packed & ((1 << pos_bits) - 1), first_sorted, axis=1)
    if valid is not None:
        first &= valid
    return first


def _first_distinct(
    draws: np.ndarray, k: int, size: int, valid: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` distinct ids of each row of ``draws: [N, M]``, in draw order.

    Draws where ``valid`` is False are ignored.  Returns ``chosen [N, k]`` int64
    (-1 padded) and ``found [N]``, how many were found.
    """
    n = draws.shape[0]
    first = _first_mask(draws, size, valid)
    seen = np.cumsum(first, axis=1)
    keep = first & (seen <= k)
    found = np.minimum(seen[:, -1], k)
    chosen = np.full((n, k), -1, dtype=np.int64)
    r_idx, c_idx = np.nonzero(keep)
    chosen[r_idx, seen[r_idx, c_idx] - 1] = draws[r_idx, c_idx]
    return chosen, found


def _inverse_cdf(weights: np.ndarray, table: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Ids ``i`` with ``cdf[table, i-1] <= u < cdf[table, i]``, through a guide table.

    Parameters
    ----------
    weights: ``[tables, size]`` positive weights of each distribution.
    table: int array, which distribution each draw uses.
    u: uniforms in ``[0, 1)``, same shape as ``table``.
    """
    n_tables, size = weights.shape
    cdf = np.cumsum(weights, axis=1)
    cdf /= cdf[:, -1:]
    cdf[:, -1] = 1.5  # above every u < 1: the last entry catches rounding
    bins = _GUIDE_BINS_PER_ENTRY * size
    edges = np.arange(bins) / bins
    # guide[t, b]: first id whose cdf exceeds b / bins (one sorted search over all tables,
    # each shifted by 2 t so the tables stay apart).
    shift = 2.0 * np.arange(n_tables)[:, None]
    guide = np.searchsorted((cdf + shift).ravel(), (edges[None, :] + shift).ravel(), "right")
    guide = guide.reshape(n_tables, bins) - np.arange(n_tables)[:, None] * size
    flat_t = table.ravel()
    flat_u = u.ravel()
    idx = guide[flat_t, np.minimum((flat_u * bins).astype(np.int64), bins - 1)]
    cdf_flat = cdf.ravel()
    base = flat_t * size
    todo = np.flatnonzero(cdf_flat[base + idx] <= flat_u)
    while todo.size:
        idx[todo] += 1
        todo = todo[cdf_flat[base[todo] + idx[todo]] <= flat_u[todo]]
    return idx.reshape(u.shape)


def _finish_race(
    weights: np.ndarray,
    allowed: np.ndarray,
    chosen: np.ndarray,
    found: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Complete rows of ``chosen`` after ``found`` ids by an exponential race.

    Keys ``Exp(1) / w`` in increasing order give a Plackett-Luce order; ids already
    chosen and ids not ``allowed`` get an infinite key.
    """
    keys = rng.standard_exponential(weights.shape) / weights
    keys[~allowed] = np.inf
    rows = np.arange(chosen.shape[0])
    for slot in range(chosen.shape[1]):
        have = found > slot
        keys[rows[have], chosen[have, slot]] = np.inf
    need = min(chosen.shape[1], keys.shape[1])
    order = np.argpartition(keys, np.arange(need), axis=1)[:, :need]
    slot = np.arange(chosen.shape[1])[None, :] - found[:, None]
    fill = np.take_along_axis(order, np.maximum(slot, 0), axis=1)
    return np.where(slot >= 0, fill, chosen)


# -- writing -----------------------------------------------------------------------------


def write_synth(
    path: str | Path,
    params: SynthParams,
    *,
    format: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Generate ``params`` and write it with placer's trace writers.

    Parameters
    ----------
    path: output file; ``.npz`` or ``.jsonl`` / ``.jsonl.gz`` (or ``format``).
    format: ``"npz"`` or ``"jsonl"``; default from the file name.
    progress: called with ``(tokens done, tokens total)`` after each chunk.

    Returns
    -------
    ``{"path", "format", "tokens", "layers", "experts", "top_k", "seconds"}``.
    """
    fmt = format or _format_of(path)
    t0 = time.perf_counter()

    def chunks() -> Iterator[SynthChunk]:
        for chunk in synthesize(params):
            yield chunk
            if progress is not None:
                progress(chunk.start + chunk.topk_ids.shape[0], params.num_tokens)

    writer = write_npz_trace if fmt == "npz" else write_jsonl_trace
    writer(
        path,
        (
            {"topk_ids": c.topk_ids, "step": c.step, "rank": c.rank, "topk_weights": c.topk_weights}
            for c in chunks()
        ),
        layer_ids=np.asarray(params.layer_ids, dtype=np.int64),
        meta=params.header(),
    )
    return {
        "path": str(path),
        "format": fmt,
        "tokens": params.num_tokens,
        "layers": params.num_layers,
        "experts": params.num_experts,
        "top_k": params.top_k,
        "seconds": time.perf_counter() - t0,
    }


def _format_of(path: str | Path) -> str:
    name = str(path).lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    raise UsageError(
        f"cannot tell the trace format of {path}",
        where="OUTPUT",
        hint="name the output .npz, .jsonl or .jsonl.gz, or pass `format` npz|jsonl",
    )

"""Per-token traffic fitted to measured statistics: ``placer synth --from FILE``.

A second source of synthetic tokens, built differently from the popularity model of
:mod:`placer.traces.synth.generate`: instead of a shape with a few knobs, each layer's
law is fitted to a measured file's per-layer loads and same-token pair counts.

A token's ``k`` experts of a layer are drawn one after another without replacement;
after choosing ``S``, expert ``e`` is drawn with probability proportional to::

    w_e  x  (prod_{j in S} a_je) ** (1 / |S|)      a_je = clip(lift_je, 1 / CAP, CAP)

``lift`` the measured pair lift (:func:`placer.stats.analysis.pair_lift`; 1 where the file
holds no count of the pair, as thresholded co-activation files do).  The weights ``w``
are fitted so that every expert's share of the selections matches the file's load: a
multiplicative update ``w <- w x (target / reached) ** STEP`` over :data:`FIT_ROUNDS`
rounds, each reached share measured on the same :data:`FIT_TOKENS` tokens (common random
numbers: the updates see the weights' effect, not the sampling noise).

Drift: with ``drift`` ``d`` the fitted weights move over the experts' popularity order by
``d`` ranks per step (as the popularity model's drift: every expert cools gradually and
the coldest turns hottest); the pair affinities stay with the experts.  Tokens, steps and
source ranks are laid out as :mod:`placer.traces.synth` lays them out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from placer.errors import DataError
from placer.limits import check_allocation
from placer.stats import ExpertStats
from placer.traces.synth.generate import SynthChunk

#: Pair lifts are clipped to ``[1 / cap, cap]`` before they weigh a draw.
AFFINITY_CAP = 4.0
#: Tokens the weights are fitted on, rounds of the fit, and each round's step.
FIT_TOKENS = 2048
FIT_ROUNDS = 10
STEP = 0.8
#: ... and the most one round changes a weight (an unseen expert is not blown up).
MAX_RATIO = 4.0
#: How strongly the chosen experts' mean log affinity pulls the next draw (5: the bundled
#: Qwen3-30B-A3B statistics' 50 most counted pairs come out at a median lift of about 2,
#: as measured; every known pair within 15% of its measured median lift).
PULL = 5.0
#: Tokens generated at a time.
CHUNK_TOKENS = 4096


@dataclass(frozen=True)
class FittedLaw:
    """The fitted law of every layer: ``weights [layers, E]`` (rank order kept by value)
    and ``affinity [layers, E, E]`` (None without pair counts); ``reached``: the
    selections' shares the fit reached on its tokens, ``[layers, E]``."""

    layer_ids: np.ndarray
    top_k: int
    weights: np.ndarray
    affinity: np.ndarray | None
    target: np.ndarray
    reached: np.ndarray

    @property
    def num_experts(self) -> int:
        return int(self.weights.shape[1])

    def fit_error(self) -> float:
        """Largest ``|reached - target|`` share over experts and layers."""
        return float(np.abs(self.reached - self.target).max())


def fit_law(stats: ExpertStats, seed: int = 0) -> FittedLaw:
    """Fit :class:`FittedLaw` to ``stats``' load (summed over windows) and pair counts."""
    load = stats.load.sum(axis=0).astype(np.float64)  # [L, E]
    k, e = int(stats.top_k), int(stats.num_experts)
    if k < 1 or k >= e:
        raise DataError(f"cannot draw top-{k} of {e} experts", where="top_k")
    empty = np.flatnonzero(load.sum(axis=1) <= 0)
    if empty.size:
        raise DataError(f"layer {int(stats.layer_ids[empty[0]])} has no load to fit",
                        hint="drop the layer from the file, or give a file with its load")
    target = load / load.sum(axis=1, keepdims=True)
    check_allocation(8 * load.shape[0] * e * e * (stats.coact is not None)
                     + 12 * k * FIT_TOKENS * e,
                     f"fitting {load.shape[0]:,} layers of {e:,} experts (a [layers, experts,"
                     " experts] affinity)", "a file with fewer experts or layers",
                     error=DataError)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(3,)))
    weights = np.empty_like(target)
    reached = np.empty_like(target)
    affinity = None if stats.coact is None else np.ones((load.shape[0], e, e))
    for row in range(load.shape[0]):
        a = None
        if affinity is not None:
            a = _affinity(stats, row, load[row], k)
            affinity[row] = a
        noise = rng.gumbel(size=(k, FIT_TOKENS, e)).astype(np.float32)
        w = np.maximum(target[row], 1e-9)
        for _ in range(FIT_ROUNDS):
            share = _shares(_draw(np.log(w), a, noise.__getitem__, FIT_TOKENS, k), e)
            floor = 0.5 / (FIT_TOKENS * k)  # below one draw in the sample: unseen
            ratio = np.maximum(target[row], floor) / np.maximum(share, floor)
            w = w * np.clip(ratio, 1 / MAX_RATIO, MAX_RATIO) ** STEP
            w = np.maximum(w / w.max(), 1e-12)
        weights[row] = w
        reached[row] = _shares(_draw(np.log(w), a, noise.__getitem__, FIT_TOKENS, k), e)
    return FittedLaw(layer_ids=np.asarray(stats.layer_ids), top_k=k, weights=weights,
                     affinity=affinity, target=target, reached=reached)


def synthesize_from(law: FittedLaw, *, num_tokens: int, tokens_per_step: int,
                    num_ranks: int = 0, drift: float = 0.0,
                    seed: int = 0) -> Iterator[SynthChunk]:
    """Tokens of ``law``, chunk by chunk (:class:`~placer.traces.synth.SynthChunk`)."""
    order = np.argsort(-law.weights, axis=1, kind="stable")  # [L, E] experts by weight
    log_sorted = np.log(np.take_along_axis(law.weights, order, axis=1))
    for index, start in enumerate(range(0, num_tokens, CHUNK_TOKENS)):
        stop = min(start + CHUNK_TOKENS, num_tokens)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(4, index)))
        token = np.arange(start, stop, dtype=np.int64)
        step = token // tokens_per_step
        slot = token % tokens_per_step
        ids = np.empty((stop - start, law.layer_ids.size, law.top_k), dtype=np.int16)
        for row in range(law.layer_ids.size):
            log_w = _drifted(log_sorted[row], order[row], step, drift)
            a = None if law.affinity is None else law.affinity[row]

            ids[:, row] = _draw(log_w, a, _gumbel(rng, stop - start, law.num_experts),
                                stop - start, law.top_k)
        yield SynthChunk(start=start, topk_ids=ids, step=step,
                         rank=slot % num_ranks if num_ranks else None)


def header(law: FittedLaw, source: str, *, model: str | None, num_tokens: int,
           tokens_per_step: int, num_ranks: int, drift: float, seed: int) -> dict[str, Any]:
    """Trace metadata of a fitted trace (``synthetic: true``, the source it was fitted to)."""
    return {
        "model": model or "synthetic", "num_layers": int(law.layer_ids.size),
        "num_experts": law.num_experts, "top_k": law.top_k, "synthetic": True,
        "generator": "placer.traces.synth.fitted", "synth_from": source,
        "synth_num_tokens": num_tokens, "synth_tokens_per_step": tokens_per_step,
        "synth_num_ranks": num_ranks, "synth_drift": drift, "synth_seed": seed,
        "synth_pairs": law.affinity is not None,
    }


def _affinity(stats: ExpertStats, row: int, load: np.ndarray, k: int) -> np.ndarray:
    """``[E, E]`` clipped pair lifts of one layer (1 where no pair count is known)."""
    assert stats.coact is not None
    e = load.size
    a = np.ones((e, e))
    i, j, count = stats.coact.pairs(row)
    tokens = load.sum() / k
    with np.errstate(divide="ignore", invalid="ignore"):
        lift = count * tokens / (load[i] * load[j])
    ok = np.isfinite(lift) & (lift > 0)
    lift = np.clip(lift[ok], 1 / AFFINITY_CAP, AFFINITY_CAP)
    a[i[ok], j[ok]] = lift
    a[j[ok], i[ok]] = lift
    return a


def _draw(log_w: np.ndarray, affinity: np.ndarray | None,
          noise: Callable[[int], np.ndarray], n: int, k: int) -> np.ndarray:
    """``[n, k]`` experts drawn one after another without replacement, each by the
    largest ``log weight + Gumbel`` among those left (``noise(pick)``: ``[n, E]``
    Gumbel draws of the ``pick``-th choice); ``log_w``: ``[E]`` or ``[n, E]``."""
    e = log_w.shape[-1]
    base = np.broadcast_to(log_w, (n, e)).astype(np.float32)
    pulled = np.zeros((n, e), dtype=np.float32)  # summed log affinity to those chosen
    taken = np.zeros((n, e), dtype=bool)
    log_a = None if affinity is None else np.log(affinity).astype(np.float32)
    chosen = np.empty((n, k), dtype=np.int64)
    rows = np.arange(n)
    for pick in range(k):
        score = base + noise(pick)
        if pick and log_a is not None:
            score += pulled * (PULL / pick)  # the chosen experts' mean affinity, scaled
        score[taken] = -math.inf
        best = np.argmax(score, axis=1)
        chosen[:, pick] = best
        taken[rows, best] = True
        if log_a is not None:
            pulled += log_a[best]
    return chosen


def _gumbel(rng: np.random.Generator, n: int, e: int) -> Callable[[int], np.ndarray]:
    """Fresh ``[n, e]`` float32 Gumbel draws for each pick."""
    def draw(_pick: int) -> np.ndarray:
        u = rng.random((n, e), dtype=np.float32)
        gumbel: np.ndarray = -np.log(-np.log(np.maximum(u, np.float32(1e-30))))
        return gumbel
    return draw


def _shares(chosen: np.ndarray, num_experts: int) -> np.ndarray:
    counts = np.bincount(chosen.ravel(), minlength=num_experts).astype(np.float64)
    return counts / counts.sum()


def _drifted(log_sorted: np.ndarray, order: np.ndarray, step: np.ndarray,
             drift: float) -> np.ndarray:
    """``[tokens, E]`` (or ``[E]`` without drift) log weights at each token's step: the
    expert of popularity rank ``r`` takes the weight of rank ``r + drift x step`` (mod E,
    linear in log weight between ranks; the coldest ramps up to the hottest)."""
    e = log_sorted.size
    out = np.empty(e)
    if drift == 0:
        out[order] = log_sorted
        return out
    ring = np.concatenate([log_sorted, log_sorted[:1]])  # rank E is rank 0 again
    shift = np.mod(drift * step.astype(np.float64), e)  # [tokens]
    steps, inverse = np.unique(shift, return_inverse=True)
    rank = np.mod(np.arange(e)[None, :] + steps[:, None], e)  # [distinct, E]
    table = np.interp(rank, np.arange(e + 1), ring)
    by_expert = np.empty_like(table)
    by_expert[:, order] = table
    result: np.ndarray = by_expert[inverse]
    return result

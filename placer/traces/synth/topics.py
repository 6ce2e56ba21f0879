"""Request topics, and how the mix of requests drifts over steps.

Measured MoE routing drifts with the mix of requests, not token by token: expert
popularity is stable while a request lasts, shifts when the share of code, chat or
mathematics in the batch changes (often abruptly, when a burst of similar requests
arrives, and slowly over the day), a few experts stay hot whatever the topic, and deep
layers follow the topic more than shallow ones, which follow the token.  This module
models exactly that, in two parts:

- :func:`topic_profiles`: each topic's popularity order of the experts of each layer.
  An expert's score under topic ``t`` in layer ``l`` is::

      score[t, l, e] = sqrt(overlap[l]) * shared[l, e] + sqrt(1 - overlap[l]) * own[t, l, e]
      own[t, l, e]   = sqrt(1 - CLUSTER_SHARE) * u[t, l, e] + sqrt(CLUSTER_SHARE) * v[t, l, c(e)]

  ``shared`` are standard normal order statistics in the order of the trace's global
  popularity ranks (the hottest expert gets the largest), ``u`` and ``v`` independent
  standard normals, ``c(e)`` the expert's co-activation cluster (``v`` is left out without
  clusters).  Two topics' scores are correlated by ``overlap[l]``: globally hot experts
  stay hot across topics, and the experts of one cluster rise and fall together.  The
  topic's rank of an expert orders the scores (0 = hottest).

- :class:`TopicTimeline`: the batch as ``tokens_per_step`` slots, each running one
  request at a time.  At step 0 every slot starts a request; afterwards each request ends
  with probability ``1 / request_steps`` per step (a geometric length of mean
  ``request_steps``) and a new one starts in its slot.  A new request takes a topic from
  the mix of its first step::

      mix(s) = (1 - burst_share) * background(s) + burst_share * [topic == dominant(s)]
      background_t(s) ∝ share_t * exp(MIX_AMPLITUDE * sin(2 pi (s / mix_period + t / topics)))

  ``share`` is each topic's long-run share (uniform on the simplex), the sine the slow
  (diurnal) cycle of the mix (none when ``mix_period`` is 0); the dominant topic switches
  at the steps of a Poisson process of mean gap ``burst_every`` (no bursts when 0) to a
  topic drawn from the background, the current one left out.  A request keeps its topic
  (and its co-activation cluster, drawn uniformly when it starts) until it ends; slot
  ``j`` serves its requests on source rank ``j % ranks``.

The timeline draws from its own seeded stream, step after step, so it does not depend on
how the tokens are cut into chunks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from placer.traces.synth.params import SynthParams

__all__ = ["CLUSTER_SHARE", "MIX_AMPLITUDE", "TopicTimeline", "topic_profiles"]

#: Share of the variance of a topic's own expert scores common to an expert's cluster.
CLUSTER_SHARE = 0.5
#: Amplitude of the slow cycle of the background mix, in e-folds of a topic's share.
MIX_AMPLITUDE = 1.0

#: Seed streams (``SeedSequence`` spawn keys) of the topic profiles and the timeline;
#: the layout and the chunks use 0 and 1.
PROFILE_STREAM, TIMELINE_STREAM = 2, 3


def topic_profiles(
    params: SynthParams, popularity_rank: np.ndarray, cluster_of: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each topic's popularity ranks and long-run share, drawn from ``params.seed``.

    Parameters
    ----------
    popularity_rank: ``[layers, experts]`` int64 global rank of each expert (0 = hottest).
    cluster_of: ``[layers, experts]`` int64 co-activation cluster of each expert (-1: none).

    Returns
    -------
    ``(rank, share)``: ``rank [topics, layers, experts]`` int64, the rank of each expert
    under each topic; ``share [topics]`` float64, summing to 1.
    """
    rng = np.random.default_rng(np.random.SeedSequence(params.seed, spawn_key=(PROFILE_STREAM,)))
    n_topics, n_layers, e = params.topics, params.num_layers, params.num_experts
    share = rng.dirichlet(np.ones(n_topics))
    # Step 1: the shared score, in the order of the global popularity.
    ordered = -np.sort(-rng.standard_normal((n_layers, e)), axis=1)
    shared = np.take_along_axis(ordered, popularity_rank, axis=1)
    # Step 2: each topic's own score; the experts of one cluster share part of it.
    own = rng.standard_normal((n_topics, n_layers, e))
    if params.clusters:
        per_cluster = rng.standard_normal((n_topics, n_layers, params.clusters))
        of_cluster = np.take_along_axis(
            per_cluster, np.broadcast_to(cluster_of[None], own.shape), axis=2)
        own = math.sqrt(1 - CLUSTER_SHARE) * own + math.sqrt(CLUSTER_SHARE) * of_cluster
    # Step 3: mix them by the layer's overlap and rank the scores, hottest first.
    overlap = params.topic_overlap_per_layer()[None, :, None]
    score = np.sqrt(overlap) * shared[None] + np.sqrt(1 - overlap) * own
    order = np.argsort(-score, axis=2, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(e)[None, None, :], axis=2)
    return rank, share


class TopicTimeline:
    """The requests in the slots of the batch, step by step (see the module docstring).

    Walk it forward only: :meth:`assign` takes tokens in increasing step order, chunk
    after chunk, and remembers the step it stands at.

    Parameters
    ----------
    params: the trace's settings (``topics > 0``).
    share: ``[topics]`` long-run share of each topic (from :func:`topic_profiles`).
    """

    def __init__(self, params: SynthParams, share: np.ndarray) -> None:
        self.params = params
        self.share = np.asarray(share, dtype=np.float64)
        self._rng = np.random.default_rng(
            np.random.SeedSequence(params.seed, spawn_key=(TIMELINE_STREAM,)))
        slots = params.tokens_per_step
        self.step = -1
        #: ``[slots]`` topic and cluster of the request each slot runs at :attr:`step`.
        self.topic = np.zeros(slots, dtype=np.int64)
        self.cluster = np.zeros(slots, dtype=np.int64)
        #: the dominant topic at :attr:`step` (-1 without bursts).
        self.dominant = -1

    def background(self, step: int) -> np.ndarray:
        """``[topics]`` the background mix at ``step`` (sums to 1)."""
        p = self.params
        if not p.mix_period:
            return self.share
        phase = step / p.mix_period + np.arange(p.topics) / p.topics
        mix = self.share * np.exp(MIX_AMPLITUDE * np.sin(2 * np.pi * phase))
        return mix / mix.sum()

    def mixture(self, step: int) -> np.ndarray:
        """``[topics]`` the topic law of a request starting at ``step`` (at :attr:`step`
        for the dominant topic)."""
        mix = self.background(step)
        if self.dominant < 0:
            return mix
        burst = np.zeros_like(mix)
        burst[self.dominant] = 1.0
        return (1 - self.params.burst_share) * mix + self.params.burst_share * burst

    def advance(self) -> None:
        """Move to the next step: switch the dominant topic, end requests, start new ones."""
        p, rng = self.params, self._rng
        self.step += 1
        if p.burst_every:
            if self.step == 0:
                self.dominant = _draw(self.background(0), rng.random(1))[0]
            elif rng.random() < -math.expm1(-1.0 / p.burst_every):
                others = self.background(self.step).copy()
                others[self.dominant] = 0.0
                if others.sum() > 0:
                    self.dominant = _draw(others / others.sum(), rng.random(1))[0]
        if self.step == 0:
            new = np.arange(self.topic.size)
        else:
            new = np.flatnonzero(rng.random(self.topic.size) < 1.0 / p.request_steps)
        self.topic[new] = _draw(self.mixture(self.step), rng.random(new.size))
        if p.clusters:
            self.cluster[new] = rng.integers(0, p.clusters, size=new.size)

    def assign(self, step: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Topic and cluster ``[tokens]`` of tokens at ``step`` (non-decreasing, not before
        :attr:`step`) in ``slot`` of the batch."""
        topic = np.empty(step.size, dtype=np.int64)
        cluster = np.empty(step.size, dtype=np.int64)
        if not step.size:
            return topic, cluster
        bounds = np.flatnonzero(np.diff(step)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, step.size], strict=True):
            while self.step < step[lo]:
                self.advance()
            topic[lo:hi] = self.topic[slot[lo:hi]]
            cluster[lo:hi] = self.cluster[slot[lo:hi]]
        return topic, cluster


def _draw(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Indices drawn from the law ``p`` with the uniforms ``u`` (inverse CDF)."""
    cdf = np.cumsum(p)
    return np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), p.size - 1)

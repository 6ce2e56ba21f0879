"""Synthetic per-token routing traces with controllable skew, clusters, topics and drift.

The generator draws each token's top-k experts of each layer from a Plackett-Luce
model: experts are picked one after another without replacement, each with
probability proportional to its weight among those not yet picked (the law of
"Gumbel-top-k" sampling, :mod:`.sampling`).  The weights of layer ``l`` for a token at
step ``s`` whose request has topic ``t`` and co-activation cluster ``c`` are::

    w_e = pop(r_e(s))  *  (cluster_boost if cluster_of[l, e] == c else 1)
    r_e(s) = (rank[t, l, e] + drift * s) mod E

- *skew*: ``pop(r) = (1 + r) ** -zipf[l]`` (``popularity`` ``zipf``: ``zipf`` the Zipf
  exponent) or ``exp(zipf[l] x (z(r) - z(0)))`` (``lognormal``: ``z(r)`` the normal
  quantile of ``1 - (r + 0.5) / E``, ``zipf`` the log weights' deviation); 0 = uniform.
  :mod:`.skew` sets per-layer values from a preset (mild, real, heavy) so that the
  loads' Gini follows measured routing's;
- *co-activation clusters*: each layer's experts are split at random into ``clusters``
  equal clusters; every token belongs to one cluster index (the same in all layers),
  which multiplies its cluster's weights by ``cluster_boost``: experts of one cluster
  are co-selected more often than chance, and the clusters of consecutive layers that
  share an index show inter-layer affinity;
- *topics* (:mod:`.topics`, off when ``topics`` is 0): each topic orders the experts of
  each layer its own way, correlated with the global order by the layer's
  ``topic_overlap``; requests run in the batch's slots for ``request_steps`` steps on
  average and keep their topic and cluster; new requests take their topic from a mix
  that switches its dominant topic in bursts (every ``burst_every`` steps on average,
  taking ``burst_share`` of new requests) and cycles slowly (``mix_period``).  Without
  topics every token has topic 0 with ``rank[0] = popularity_rank``, and draws its
  cluster uniformly by itself;
- *drift*: the popularity order rotates by ``drift`` ranks per step: every expert cools
  gradually, and the coldest one turns hottest (over one rank, linearly in log-weight);
- *group-limited routing* (DeepSeek-V3): experts ``g*E/G .. (g+1)*E/G - 1`` form group
  ``g``; a token first picks ``top_groups`` groups (Plackett-Luce on the groups' total
  weights), then its ``top_k`` experts among the experts of those groups only.

Tokens are numbered ``0..N-1``; token ``t`` runs at step ``t // tokens_per_step`` in
slot ``t % tokens_per_step`` of the batch, on source rank ``slot % num_ranks``
(round-robin over DP ranks; no ranks are recorded when ``num_ranks`` is 0).  Same
parameters and seed give the same trace.

Modules: :mod:`.params` (the settings), :mod:`.topics` (topic profiles and requests over
steps), :mod:`.sampling` (Plackett-Luce, vectorized), :mod:`.generate` (layout and
chunks), :mod:`.write` (files).
"""

from placer.traces.synth.generate import SynthChunk, SynthLayout, synth_layout, synthesize
from placer.traces.synth.params import SynthParams, params_for_model
from placer.traces.synth.topics import TopicTimeline
from placer.traces.synth.write import write_synth

__all__ = [
    "SynthChunk",
    "SynthLayout",
    "SynthParams",
    "TopicTimeline",
    "params_for_model",
    "synth_layout",
    "synthesize",
    "write_synth",
]

"""How to evaluate: the dispatch policy, all-to-all mode, batches, seed and windows of one
evaluation (:class:`EvalParams`), checked when built, and the one rule that turns a
:class:`~placer.regime.Regime` into them (:func:`regime_params`), which every command uses
so that one placement on one trace gets one set of figures.

The rule: a step (batch) is ``tokens_per_gpu x G`` consecutive tokens of the judged windows
when the routing is per-token and at most :data:`REPLAY_MAX_SELECTIONS` selections large
(a replay), else batches of that size sampled from the statistics: as many as
:data:`SAMPLED_TOKEN_LAYERS_BUDGET` (token, layer) pairs hold over the judged layers, at
least :data:`SAMPLED_BATCHES_MIN`, at most ``constants.DEFAULT_SAMPLED_BATCHES``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from placer import constants
from placer.errors import Param, UsageError
from placer.regime import MODES, POLICIES, Regime
from placer.stats import RoutingData

#: A per-token replay larger than this many (token, layer, pick) selections per
#: placement is sampled instead (a replay costs time in proportion).
REPLAY_MAX_SELECTIONS = 1 << 26
#: Sampled batches: as many as fit in this many (token, layer) pairs, within
#: [:data:`SAMPLED_BATCHES_MIN`, ``constants.DEFAULT_SAMPLED_BATCHES``]: 16 decode batches
#: of DeepSeek-V3 on 32 GPUs (4,096 tokens x 58 layers each), 2 prefill batches (131,072
#: tokens each; a judgement then costs seconds per placement, as a prefill step is large).
SAMPLED_TOKEN_LAYERS_BUDGET = 1 << 22
SAMPLED_BATCHES_MIN = 2


@dataclass(frozen=True)
class EvalParams:
    """How to evaluate.

    Attributes
    ----------
    policy: dispatch policy, one of ``vllm_hash`` (vLLM), ``trtllm_block``
        (TensorRT-LLM), ``round_robin`` (vLLM before its hash), ``sglang`` (current
        SGLang static dispatch), ``local_first`` (SGLang's earlier static dispatch),
        ``random`` (:mod:`placer.evaluate.dispatch`).
    mode: ``normal`` (DeepEP normal kernels: one copy per destination GPU, one per
        destination node across nodes) or ``low_latency`` (one copy per selection).
    batch_tokens: tokens per batch; None = the trace's steps when every token has one,
        else ``constants.DEFAULT_BATCH_TOKENS``.  Sampled batches have this many tokens.
    num_batches: batches to sample when only aggregated statistics are available.
    seed: seeds sampling, the ``random`` policy and the static tables (``sglang`` draws
        with Python's ``random.Random(42 + seed)``: seed 0 is SGLang's own table).
    dtype: expert dtype (``bf16``, ``fp8``, ``mxfp4``); None = the model's default.
    windows: ``(start, stop)`` windows of the routing data to evaluate; None = all.
    sample: sample batches from the statistics even when a per-token trace is present.
    """

    policy: str = "round_robin"
    mode: str = "normal"
    batch_tokens: int | None = None
    num_batches: int = constants.DEFAULT_SAMPLED_BATCHES
    seed: int = 0
    dtype: str | None = None
    windows: tuple[int, int] | None = None
    sample: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise UsageError(
                f"unknown dispatch policy {self.policy!r}", where=Param("policy"),
                hint=f"choose one of: {', '.join(POLICIES)}",
            )
        if self.mode not in MODES:
            raise UsageError(
                f"unknown all-to-all mode {self.mode!r}", where=Param("mode"),
                hint=f"choose one of: {', '.join(MODES)}",
            )
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise UsageError(f"expected batch tokens >= 1, got {self.batch_tokens}",
                             where=Param("batch_tokens"),
                             hint="give a value >= 1; the nearest valid one is 1")
        if self.num_batches < 1:
            raise UsageError(f"expected number of batches >= 1, got {self.num_batches}",
                             where=Param("num_batches"))
        if self.dtype is not None and self.dtype not in constants.DTYPES:
            raise UsageError(
                f"unknown dtype {self.dtype!r}", where=Param("dtype"),
                hint=f"choose one of: {', '.join(constants.DTYPES)}",
            )
        if self.windows is not None and not 0 <= self.windows[0] < self.windows[1]:
            raise UsageError(
                f"window range {self.windows[0]}:{self.windows[1]} is empty",
                where=Param("held_out")
            )


def regime_params(
    regime: Regime, num_gpus: int, *, num_layers: int = 1, dtype: str | None = None,
    windows: tuple[int, int] | None = None, sample: bool = False,
) -> EvalParams:
    """The evaluator's parameters for ``regime`` on ``num_gpus`` EP ranks.

    Policy, mode and seed come from the regime, a step is ``tokens_per_gpu x G`` tokens;
    sampled batches: as many as :data:`SAMPLED_TOKEN_LAYERS_BUDGET` (token, layer) pairs
    hold over ``num_layers`` layers, within [:data:`SAMPLED_BATCHES_MIN`,
    ``constants.DEFAULT_SAMPLED_BATCHES``].

    >>> regime_params(Regime(), 8, num_layers=4).batch_tokens
    1024
    """
    batch = regime.batch_tokens(num_gpus)
    batches = min(constants.DEFAULT_SAMPLED_BATCHES,
                  max(SAMPLED_BATCHES_MIN,
                      SAMPLED_TOKEN_LAYERS_BUDGET // (batch * max(num_layers, 1))))
    return EvalParams(policy=regime.dispatch, mode=regime.all_to_all, batch_tokens=batch,
                      num_batches=batches, seed=regime.seed, dtype=dtype, windows=windows,
                      sample=sample)


def replay_or_sample(routing: RoutingData, windows: tuple[int, int]) -> tuple[bool, str]:
    """Whether judging ``windows`` of ``routing`` samples batches (True) or replays its
    per-token trace (False), and why it samples, in words ("" when it replays)."""
    if routing.trace is None:
        return True, "aggregated statistics, no per-token routing"
    tokens = int(np.asarray(routing.stats.tokens)[windows[0]:windows[1]].sum())
    _, layers, picks = routing.trace.topk_ids.shape
    selections = tokens * int(layers) * int(picks)
    if selections > REPLAY_MAX_SELECTIONS:
        return True, (f"{selections:,} selections are more than a judgement replays"
                      f" ({REPLAY_MAX_SELECTIONS:,}); sampled batches instead")
    return False, ""


def judge_sample(
    routing: RoutingData, windows: tuple[int, int], num_batches: int,
    batch_tokens: int | None,
) -> tuple[RoutingData | None, str, dict[str, int] | None]:
    """The part of a sampled trace (``routing.trace.sample``) a summary replays on
    ``windows``: at most ``num_batches`` of the whole batches held there, spread evenly
    over them in time (the same batches for the same trace and seed).

    Returns ``(routing cut to those batches, what was judged in words, its figures)``;
    the routing is None, with why in words, when no held batch is in the windows or
    the sample's batches are not ``batch_tokens`` long (the judge then samples batches
    from the statistics).
    """
    trace = routing.trace
    assert trace is not None and trace.sample is not None
    sample = trace.sample
    if batch_tokens is not None and sample.batch_tokens != batch_tokens:
        return None, (f"the per-token sample holds batches of {sample.batch_tokens:,}"
                      f" tokens, the judge's are {batch_tokens:,}; sampled batches"
                      " instead"), None
    start, stop = windows
    inside = (sample.window >= start) & (sample.window < stop)
    held = np.unique(sample.batch[inside])
    doc = {"trace_tokens": sample.num_tokens, "batches_held": int(held.size),
           "per_window": sample.per_window, "seed": sample.seed}
    if held.size == 0:
        return None, (f"the per-token sample holds no batch that starts in windows"
                      f" {start}:{stop}; sampled batches instead"), doc
    # evenly spread in time: the middle batch of each of num_batches equal shares
    middle = (np.arange(num_batches) + 0.5) * held.size / num_batches
    chosen = held if held.size <= num_batches else held[middle.astype(np.int64)]
    cut = RoutingData(routing.stats, trace.take(np.isin(sample.batch, chosen) & inside))
    doc["batches_judged"] = int(chosen.size)
    why = (f"the trace's {sample.num_tokens:,} tokens are too many to keep: read as a"
           f" sample of whole batches, {sample.per_window} per window (seed"
           f" {sample.seed}); judged on {chosen.size} of the {held.size} held in these"
           " windows, spread evenly")
    return cut, why, doc


@dataclass(frozen=True)
class JudgedSample:
    """What a judge replayed of a trace read as a sample (``routing.trace.sample``).

    Attributes
    ----------
    of_tokens: tokens the judged windows hold in all.
    sample: :func:`judge_sample`'s figures (``trace_tokens``, ``batches_held``,
        ``per_window``, ``seed``, ``batches_judged`` when batches were replayed).
    why: what was judged, in words (the sample and the batches replayed, or why
        batches were sampled from the statistics instead).
    """

    of_tokens: int
    sample: dict[str, int] | None
    why: str

    def to_dict(self, num_tokens: int, replayed: bool) -> dict[str, Any]:
        """Plan's ``judged`` fields: ``num_tokens`` judged, ``of_tokens`` the windows hold
        (``num_tokens`` when batches were sampled from the statistics, not ``replayed``),
        ``sample`` and ``why``."""
        return {"num_tokens": num_tokens, "of_tokens": self.of_tokens if replayed else num_tokens,
                "sample": self.sample, "why": self.why}


def judged_part(
    routing: RoutingData, windows: tuple[int, int], params: EvalParams,
) -> tuple[RoutingData, EvalParams, JudgedSample | None]:
    """The routing and parameters that judge ``windows`` by the one rule: a trace kept
    whole is replayed unless :func:`replay_or_sample` says it is too large; a trace read
    as a sample is cut to at most ``params.num_batches`` of its whole batches there
    (:func:`judge_sample`), or batches are sampled from the statistics when none fits.
    The third value says what of a sampled trace was judged (None: kept whole)."""
    trace = routing.trace
    if trace is None or trace.sample is None:
        return routing, replace(params, sample=replay_or_sample(routing, windows)[0]), None
    cut, why, doc = judge_sample(routing, windows, params.num_batches, params.batch_tokens)
    of = int(np.asarray(routing.stats.tokens)[windows[0]:windows[1]].sum())
    note = JudgedSample(of, doc, why)
    if cut is None:
        return routing, replace(params, sample=True), note
    return cut, replace(params, sample=False), note

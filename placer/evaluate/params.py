"""How to evaluate: the dispatch policy, all-to-all mode, batches, seed and windows of one
evaluation (:class:`EvalParams`), checked when built."""

from __future__ import annotations

from dataclasses import dataclass

from placer import constants
from placer.errors import Param, UsageError
from placer.evaluate.dispatch import POLICIES
from placer.evaluate.traffic import MODES


@dataclass(frozen=True)
class EvalParams:
    """How to evaluate.

    Attributes
    ----------
    policy: dispatch policy, one of ``round_robin`` (vLLM, TensorRT-LLM), ``sglang``
        (current SGLang static dispatch), ``local_first`` (SGLang's earlier static
        dispatch), ``random``.
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
                             where=Param("batch_tokens"))
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

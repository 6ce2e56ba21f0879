"""What the cluster runs: the serving engine and the batch regime a plan is judged under.

A :class:`Workload` fixes how the evaluator simulates a layer for planning and for the
plan's summary:

- the **engine** fixes the dispatch policy (how a replica is chosen): ``sglang`` uses
  SGLang's static dispatch (same GPU, else same node, else a seeded fair draw), ``vllm``
  and ``trtllm`` round-robin;
- the **phase** fixes the all-to-all kernels and the batch size: ``decode`` uses DeepEP's
  low-latency kernels (one copy per selection, NVLink inside a node) with small batches,
  where expert GEMMs are memory-bound; ``prefill`` the normal kernels (one copy per
  destination GPU and node) with large ones;
- ``tokens_per_gpu`` is the batch each EP rank dispatches per step (decode default 128,
  DeepEP's production setting; prefill 4096).
"""

from __future__ import annotations

from dataclasses import dataclass

from placer.errors import Param, UsageError

#: Engine -> the dispatch policy it uses (``placer.evaluate.POLICIES``).
ENGINE_POLICY = {"sglang": "sglang", "vllm": "round_robin", "trtllm": "round_robin"}
ENGINES = tuple(ENGINE_POLICY)
#: Phase -> the communication mode of its kernels (``placer.evaluate.MODES``).
PHASE_MODE = {"decode": "low_latency", "prefill": "normal"}
PHASES = tuple(PHASE_MODE)
#: Tokens each rank dispatches per step when not given.
DEFAULT_TOKENS_PER_GPU = {"decode": 128, "prefill": 4096}


@dataclass(frozen=True)
class Workload:
    """The engine and batch regime a placement serves.

    Attributes
    ----------
    engine: ``sglang``, ``vllm`` or ``trtllm``.
    phase: ``decode`` or ``prefill``.
    tokens_per_gpu: tokens each EP rank dispatches per step; None = the phase's default.
    """

    engine: str = "vllm"
    phase: str = "decode"
    tokens_per_gpu: int | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_POLICY:
            raise UsageError(f"unknown engine {self.engine!r}", where=Param("engine"),
                             hint=f"choose one of: {', '.join(ENGINES)}")
        if self.phase not in PHASE_MODE:
            raise UsageError(f"unknown workload {self.phase!r}", where=Param("workload"),
                             hint=f"choose one of: {', '.join(PHASES)}")
        if self.tokens_per_gpu is not None and self.tokens_per_gpu < 1:
            raise UsageError(f"expected tokens per GPU >= 1, got {self.tokens_per_gpu}",
                             where=Param("tokens_per_gpu"))

    @property
    def policy(self) -> str:
        """The evaluator's dispatch policy for this engine."""
        return ENGINE_POLICY[self.engine]

    @property
    def mode(self) -> str:
        """The evaluator's communication mode for this phase."""
        return PHASE_MODE[self.phase]

    @property
    def tokens(self) -> int:
        """Tokens per GPU per step, the default filled in."""
        return self.tokens_per_gpu or DEFAULT_TOKENS_PER_GPU[self.phase]

    def batch_tokens(self, num_gpus: int) -> int:
        """Tokens of one step over the whole EP group."""
        return self.tokens * num_gpus

    def describe(self) -> str:
        """One line for summaries: ``sglang decode, 128 tokens per GPU (static dispatch,
        low-latency all-to-all)``."""
        return (f"{self.engine} {self.phase}, {self.tokens} tokens per GPU"
                f" ({self.policy} dispatch, {self.mode} all-to-all)")

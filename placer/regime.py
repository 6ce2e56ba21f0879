"""The regime a placement is judged under: the serving engine, its batch and all-to-all.

One :class:`Regime` fixes how the evaluator simulates a layer, the same way in every
command (``plan``, ``evaluate``, ``compare``, ``report``, ``replay`` and ``redundant =
auto``), so one placement on one trace gets one set of figures:

- the **engine** fixes the dispatch policy (how a replica is chosen): ``sglang`` uses
  SGLang's static dispatch (same GPU, else same node, else a seeded fair draw), ``vllm``
  a hash of each token's row (``vllm_hash``), ``trtllm`` TensorRT-LLM's round robin in
  blocks of 1,024 selections (``trtllm_block``);
- the **workload** (decode or prefill) fixes the all-to-all kernels and the batch size: ``decode``
  uses DeepEP's low-latency kernels (one copy per selection, NVLink inside a node) with
  small batches, where expert GEMMs are memory-bound; ``prefill`` the normal kernels (one
  copy per destination GPU and node) with large ones;
- ``tokens_per_gpu`` is the batch each EP rank dispatches per step (decode default 128,
  DeepEP's production setting; prefill 4096): a step is ``tokens_per_gpu x G`` tokens;
- ``dispatch_override`` and ``all_to_all_override`` replace the engine's dispatch and the
  workload's kernels (for experts: what-if an engine dispatched otherwise); ``seed``
  seeds sampling, the ``random`` policy and SGLang's static tables (seed 0 is SGLang's
  own table).

Example::

    >>> Regime().describe()
    'vllm decode, 128 tokens per GPU (vllm_hash dispatch, low_latency all-to-all)'
    >>> Regime("sglang", "prefill").batch_tokens(16)
    65536
"""

from __future__ import annotations

from dataclasses import dataclass

from placer.errors import Param, UsageError

#: Dispatch policies the evaluator knows: ``vllm_hash`` (vLLM), ``trtllm_block``
#: (TensorRT-LLM), ``round_robin`` (vLLM before its hash), ``sglang`` (SGLang's static
#: dispatch), ``local_first`` (SGLang's earlier static rule), ``random``.
POLICIES = ("vllm_hash", "trtllm_block", "round_robin", "sglang", "local_first", "random")
#: All-to-all modes: DeepEP's ``normal`` kernels (one copy per destination GPU and node),
#: ``low_latency`` (one copy per selection, NVLink inside a node), ``low_latency_rdma``
#: (one copy per selection, every copy over RDMA).
MODES = ("normal", "low_latency", "low_latency_rdma")


@dataclass(frozen=True)
class ServingEngine:
    """One serving engine, or one placement file an engine loads, as placer knows it.

    Attributes
    ----------
    name: the engine's ``--engine`` value (when it has a dispatch rule of its own) and the
        ``--export``/``--format`` name of its placement file.
    title: the engine's name as its users write it (``SGLang``).
    dispatch: the dispatch rule it serves with (one of :data:`POLICIES`); None for a file
        that is no engine's own (DeepSeek EPLB's arrays) or an engine judged as another.
    judged_as: the engine whose dispatch its placement file implies (``vllm-ascend``:
        ``vllm``); None: none.
    loads_by: the flag or config field the engine loads a placement file by.
    """

    name: str
    title: str
    dispatch: str | None
    judged_as: str | None
    loads_by: str


#: Every serving engine and placement file, one entry each: adding an engine is adding
#: its entry here and its file format's module in :mod:`placer.engines`.
SERVING_ENGINES: dict[str, ServingEngine] = {e.name: e for e in (
    ServingEngine("sglang", "SGLang", "sglang", "sglang", "--init-expert-location"),
    ServingEngine("vllm", "vLLM", "vllm_hash", "vllm", "initial_expert_map_path"),
    ServingEngine("trtllm", "TensorRT-LLM", "trtllm_block", "trtllm",
                  "moe_config.load_balancer"),
    ServingEngine("vllm-ascend", "vLLM-Ascend", None, "vllm", "expert_map_path"),
    ServingEngine("eplb", "DeepSeek EPLB", None, None, ""),
)}
#: Engine -> the dispatch policy it uses.
ENGINE_POLICY = {e.name: e.dispatch for e in SERVING_ENGINES.values() if e.dispatch}
#: The engines ``--engine`` names (those with a dispatch rule of their own).
ENGINES = tuple(ENGINE_POLICY)
#: Export format -> the engine whose dispatch it implies (``eplb`` files imply none).
EXPORT_ENGINE = {e.name: e.judged_as for e in SERVING_ENGINES.values() if e.judged_as}
#: Workload -> the all-to-all mode of its kernels.
WORKLOAD_MODE = {"decode": "low_latency", "prefill": "normal"}
WORKLOADS = tuple(WORKLOAD_MODE)
#: Tokens each rank dispatches per step when not given.
DEFAULT_TOKENS_PER_GPU = {"decode": 128, "prefill": 4096}
#: The regime when nothing is said: vLLM decode, 128 tokens per GPU.
DEFAULT_ENGINE = "vllm"
DEFAULT_WORKLOAD = "decode"


@dataclass(frozen=True)
class Regime:
    """The engine and batch regime a placement serves and is judged under.

    Attributes
    ----------
    engine: ``sglang``, ``vllm`` or ``trtllm``.
    workload: ``decode`` or ``prefill``.
    tokens_per_gpu: tokens each EP rank dispatches per step; None = the workload's default.
    dispatch_override: dispatch policy instead of the engine's (:data:`POLICIES`); None =
        the engine's.
    all_to_all_override: all-to-all mode instead of the workload's (:data:`MODES`); None = the
        workload's.
    seed: seeds sampled batches, the ``random`` policy and SGLang's static tables.
    """

    engine: str = DEFAULT_ENGINE
    workload: str = DEFAULT_WORKLOAD
    tokens_per_gpu: int | None = None
    dispatch_override: str | None = None
    all_to_all_override: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_POLICY:
            raise UsageError(f"unknown engine {self.engine!r}", where=Param("engine"),
                             hint=f"choose one of: {', '.join(ENGINES)}")
        if self.workload not in WORKLOAD_MODE:
            raise UsageError(f"unknown workload {self.workload!r}", where=Param("workload"),
                             hint=f"choose one of: {', '.join(WORKLOADS)}")
        if self.dispatch_override not in (None, *POLICIES):
            raise UsageError(f"unknown dispatch policy {self.dispatch_override!r}",
                             where=Param("dispatch_override"),
                             hint=f"choose one of: {', '.join(POLICIES)}")
        if self.all_to_all_override not in (None, *MODES):
            raise UsageError(f"unknown all-to-all mode {self.all_to_all_override!r}",
                             where=Param("all_to_all_override"),
                             hint=f"choose one of: {', '.join(MODES)}")
        if self.tokens_per_gpu is not None and self.tokens_per_gpu < 1:
            raise UsageError(f"expected tokens per GPU >= 1, got {self.tokens_per_gpu}",
                             where=Param("tokens_per_gpu"),
                             hint=f"1 or more (decode engines batch about"
                             f" {DEFAULT_TOKENS_PER_GPU['decode']} per GPU)")

    @property
    def dispatch(self) -> str:
        """The evaluator's dispatch policy: the override or the engine's."""
        return self.dispatch_override or ENGINE_POLICY[self.engine]

    @property
    def all_to_all(self) -> str:
        """The evaluator's communication mode: the override or the workload's kernels'."""
        return self.all_to_all_override or WORKLOAD_MODE[self.workload]

    @property
    def tokens(self) -> int:
        """Tokens per GPU per step, the default filled in."""
        return self.tokens_per_gpu or DEFAULT_TOKENS_PER_GPU[self.workload]

    def batch_tokens(self, num_gpus: int) -> int:
        """Tokens of one step over the whole EP group."""
        return self.tokens * num_gpus

    def describe(self, batch: str | None = None) -> str:
        """One line for every command's ``judged as``: ``sglang decode, 128 tokens per GPU
        (sglang dispatch, low_latency all-to-all)``; ``batch`` says what a batch is
        instead of the tokens per GPU (e.g. a trace's own steps)."""
        return (f"{self.engine} {self.workload}, {batch or f'{self.tokens} tokens per GPU'}"
                f" ({self.dispatch} dispatch, {self.all_to_all} all-to-all)")

    def to_dict(self) -> dict[str, object]:
        """The regime as JSON values, defaults filled in."""
        return {"engine": self.engine, "workload": self.workload,
                "tokens_per_gpu": self.tokens, "policy": self.dispatch,
                "mode": self.all_to_all, "seed": self.seed}

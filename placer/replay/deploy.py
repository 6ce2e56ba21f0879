"""How to run a replayed ``eplb`` setting on each engine: the flags and fields to paste.

- vLLM: ``--enable-eplb --eplb-config '{...}'`` with ``window_size``, ``step_interval``,
  ``num_redundant_experts``, ``use_async`` (``EPLBConfig``, vllm/config/parallel.py);
- SGLang: ``--enable-eplb --eplb-rebalance-num-iterations I
  --expert-distribution-recorder-buffer-size W --ep-num-redundant-experts R``
  (python/sglang/srt/server_args.py; SGLang moves weights synchronously, and its window
  is the recorder buffer, at most the interval);
- TensorRT-LLM: ``moe_config.load_balancer`` with ``num_slots`` and
  ``layer_updates_per_iter``: it re-places ``U`` layers per iteration, so each layer every
  ``ceil(L / U)`` iterations; an interval of ``I`` steps is ``U = ceil(L / I)`` (at most
  every ``L`` iterations: longer intervals cannot be said), its statistics decay by 0.95
  per iteration instead of a window (moe_load_balancer.py).
"""

from __future__ import annotations

import json
import math

from placer.replay.policies import OnlinePolicy


def engine_flags(policy: OnlinePolicy, *, redundant: int, num_experts: int, num_gpus: int,
                 num_layers: int) -> dict[str, str]:
    """``{engine: what to paste}`` for an ``eplb`` policy, with a caveat where the engine
    cannot do exactly what was replayed."""
    r = policy.redundant if policy.redundant is not None else redundant
    config = {"window_size": policy.window, "step_interval": policy.interval,
              "num_redundant_experts": r, "use_async": policy.asynchronous}
    vllm = f"--enable-eplb --eplb-config '{json.dumps(config)}'"
    if policy.asynchronous and policy.layers != 1:
        vllm += "  # vLLM moves one layer a step in the background"
    sglang = (f"--enable-eplb --eplb-rebalance-num-iterations {policy.interval}"
              f" --expert-distribution-recorder-buffer-size {min(policy.window, policy.interval)}"
              f" --ep-num-redundant-experts {r}")
    if policy.asynchronous:
        sglang += "  # SGLang moves weights synchronously (a stall each rebalance)"
    elif policy.window > policy.interval:
        sglang += "  # SGLang's window is at most the interval"
    updates = max(1, math.ceil(num_layers / policy.interval))
    every = math.ceil(num_layers / updates)
    trtllm = ("moe_config: {load_balancer: {num_slots: "
              f"{num_experts + r}, layer_updates_per_iter: {updates}}}}}")
    if every != policy.interval:
        trtllm += (f"  # each layer re-placed every {every} iterations (not {policy.interval}),"
                   " on load decayed by 0.95 an iteration")
    return {"vllm": vllm, "sglang": sglang, "trtllm": trtllm}

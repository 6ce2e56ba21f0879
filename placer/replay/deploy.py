"""How to run a replayed setting on each engine: the flags and fields to paste.

An ``eplb`` setting (:func:`engine_flags`):

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

A ``placer`` setting runs inside vLLM only (:func:`placer_launch`): the environment that
turns placer's plugin on (``pip install 'placer[vllm]'``; :mod:`placer.online.vllm`) and
vLLM's EPLB flags at the same cadence (docs/engines.md).
"""

from __future__ import annotations

import json
import math

from placer.online.config import ENV, inline
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


def placer_launch(policy: OnlinePolicy, *, topology: str, model: str, redundant: int) -> str:
    """The line that runs a replayed ``placer`` setting inside vLLM: :data:`ENV` naming
    ``topology`` and ``model`` (a preset or a file each, as the replay read them), the
    budget and the horizon, then ``vllm serve`` with EPLB at the setting's window and
    interval; a caveat where vLLM cannot do exactly what was replayed.

    >>> p = OnlinePolicy("placer", window=100, interval=100, first=75, max_moves=64,
    ...                  asynchronous=True)
    >>> print(placer_launch(p, topology="4x-dgx-h100", model="deepseek-v3", redundant=32))
    PLACER_VLLM_POLICY='topology=4x-dgx-h100,model=deepseek-v3,max_moves=64,horizon=100'
    vllm serve <model> --enable-eplb --eplb-config '{"window_size": 100, "step_interval":
    100, "num_redundant_experts": 32, "use_async": true}'
    """
    env = inline(topology=topology, model=model, max_moves=policy.max_moves,
                 horizon=policy.horizon or policy.window,
                 asynchronous=None if policy.asynchronous else False)
    config = {"window_size": policy.window, "step_interval": policy.interval,
              "num_redundant_experts": redundant, "use_async": policy.asynchronous}
    line = (f"{ENV}='{env}' vllm serve <model> --enable-eplb"
            f" --eplb-config '{json.dumps(config)}'")
    notes = []
    if policy.asynchronous and policy.layers != 1:
        notes.append("vLLM moves one layer a step in the background")
    if policy.first != policy.interval - policy.interval // 4:
        notes.append(f"vLLM's first rearrangement is at step"
                     f" {policy.interval - policy.interval // 4}, not {policy.first}")
    return line + (f"  # {'; '.join(notes)}" if notes else "")

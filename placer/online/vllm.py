"""placer's policy inside vLLM's EPLB: the plugin vLLM loads, and the torch boundary.

vLLM runs every entry point of the ``vllm.general_plugins`` group in each of its processes
(``vllm.plugins.load_general_plugins``; ``VLLM_PLUGINS`` names the ones allowed, all when
unset).  placer registers :func:`register` there under the name ``placer``.  It does
nothing unless :data:`~placer.online.config.ENV` (``PLACER_VLLM_POLICY``) holds a
configuration: installing placer never changes an engine by itself.

Configured, it puts placer's policy in vLLM's policy table in place of the ``"default"``
entry (``vllm.distributed.eplb.policy.EPLB_POLICIES``, where ``EplbState`` looks up
``EPLBConfig.policy``).  The replacement is the least surprising of the ways in: vLLM
0.33's ``EPLBConfig.policy`` is the literal ``"default"`` (the table's keys are asserted
equal to it), and asynchronous EPLB accepts no other policy, so a policy under a name of
its own could be selected neither by ``--eplb-config`` nor with ``use_async``.

Each rearrangement vLLM calls ``rebalance_experts(weight, num_replicas, num_groups,
num_nodes, num_ranks, old_global_expert_indices)`` on every rank with the same all-reduced
window load: placer's decision (:func:`placer.online.rebalance`) is deterministic, so
every rank computes the same map.  Any error (a configuration that does not describe the
served cluster or model, a map vLLM marks with -1, an exception inside placer) logs a
warning and returns what vLLM's default policy returns for the same call: serving never
stops.  Each decision is logged at INFO under the ``vllm.placer`` logger by the first EP
rank (DEBUG on the others): moves, GB, predicted gain and compute time.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from placer.errors import PlacerError
from placer.online.config import ENV, PolicyConfig, read_config
from placer.online.rebalance import RebalanceRecord, rebalance

#: vLLM's own logger tree: its handlers and format show placer's lines with its own.
LOGGER = logging.getLogger("vllm.placer")
#: The entry point's name (what ``VLLM_PLUGINS`` must list when it is set).
PLUGIN = "placer"


def register() -> None:
    """The ``vllm.general_plugins`` entry point: placer's policy in place of vLLM's
    default when :data:`ENV` configures it, else nothing (module docstring).  Never
    raises: vLLM calls it unguarded at start, and a failure leaves vLLM's default."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return
    try:
        config = read_config(value)
        from vllm.distributed.eplb.policy import EPLB_POLICIES

        default = EPLB_POLICIES["default"]
        if getattr(default, "placer_config", None) is not None:
            return  # loaded twice in this process
        EPLB_POLICIES["default"] = policy_class(default, config)
    except Exception as e:  # a bad configuration, a vLLM without the policy table
        hint = f" (hint: {e.hint})" if isinstance(e, PlacerError) and e.hint else ""
        LOGGER.warning("placer's EPLB policy is off, vLLM's default policy runs: %s=%r: %s%s",
                       ENV, value, e, hint)
        return
    settings = config.settings
    LOGGER.info("placer's EPLB policy replaces vLLM's default (%s): %s, %s, max_moves %s,"
                " horizon %d steps; vLLM's default decides when placer cannot",
                config.source, config.model.name, config.topology.name,
                settings.max_moves if settings.max_moves is not None else "none",
                settings.horizon)


def policy_class(fallback: Any, config: PolicyConfig) -> Any:
    """A subclass of vLLM's ``AbstractEplbPolicy`` running placer's policy with
    ``config``, and ``fallback`` (vLLM's default policy) on any error."""
    from vllm.distributed.eplb.policy import AbstractEplbPolicy

    class PlacerEplbPolicy(AbstractEplbPolicy):  # type: ignore[misc,valid-type]
        """placer's online policy (placer.online), vLLM's default on any error."""

        placer_config = config
        fallback_policy = fallback

        @classmethod
        def rebalance_experts(cls, weight: Any, num_replicas: int, num_groups: int,
                              num_nodes: int, num_ranks: int,
                              old_global_expert_indices: Any = None) -> Any:
            return decide(cls.placer_config, cls.fallback_policy, weight, num_replicas,
                          num_groups, num_nodes, num_ranks, old_global_expert_indices)

    return PlacerEplbPolicy


def decide(config: PolicyConfig, fallback: Any, weight: Any, num_replicas: int,
           num_groups: int, num_nodes: int, num_ranks: int, old: Any) -> Any:
    """One rearrangement: vLLM's tensors in, placer's map out as a CPU int64 tensor
    ``[layers, num_replicas]`` (the default policy's on any error)."""
    import torch

    try:
        _check(config, weight, num_replicas, num_groups, num_ranks, old)
        record = rebalance(weight.detach().float().cpu().numpy(),
                           old.detach().cpu().numpy(), topology=config.topology,
                           model=config.model, settings=config.settings)
    except Exception as e:  # never stop serving: vLLM's default decides instead
        LOGGER.warning("placer's EPLB policy failed, vLLM's default policy decides this"
                       " rearrangement: %s: %s", type(e).__name__, e)
        return fallback.rebalance_experts(weight, num_replicas, num_groups, num_nodes,
                                          num_ranks, old)
    # every rank decides the same; one line a rearrangement, from the first EP rank
    LOGGER.log(logging.INFO if _first_rank() else logging.DEBUG, "%s",
               describe(record, config.settings.horizon))
    return torch.from_numpy(record.physical_to_logical.astype("int64"))


def _first_rank() -> bool:
    """Whether this process is the first rank of vLLM's expert-parallel group (True
    where there is none, as outside a distributed run)."""
    try:
        from vllm.distributed.parallel_state import get_ep_group

        return int(get_ep_group().rank_in_group) == 0
    except Exception:  # no group initialised: a single process says it
        return True


def describe(record: RebalanceRecord, horizon: int) -> str:
    """One log line for a decision.

    >>> import numpy as np
    >>> print(describe(RebalanceRecord(np.zeros((2, 4)), 12, 3, 2.5e9, 8.4e5, 840.0, 0.31),
    ...                1000))
    placer EPLB: 12 moves on 3 layers, 2.50 GB; predicted gain 840 ms over 1000 steps
    (840 µs a step); decided in 0.31 s
    """
    if not record.moves:
        return (f"placer EPLB: no move pays over {horizon} steps; the deployed map stays"
                f" (decided in {record.seconds:.2f} s)")
    return (f"placer EPLB: {record.moves} moves on {record.layers} layers,"
            f" {record.bytes / 1e9:.2f} GB; predicted gain {record.gain_us / 1e3:,.0f} ms"
            f" over {horizon} steps ({record.step_saved_us:,.0f} µs a step);"
            f" decided in {record.seconds:.2f} s")


def _check(config: PolicyConfig, weight: Any, num_replicas: int, num_groups: int,
           num_ranks: int, old: Any) -> None:
    """Raise PlacerError where vLLM's call does not match the configured cluster and
    model (the configuration describes another deployment)."""
    topology, model = config.topology, config.model
    if old is None:
        raise PlacerError("vLLM passed no deployed map", hint="a vLLM with"
                          " old_global_expert_indices (0.33 or later)")
    if num_ranks != topology.num_gpus:
        raise PlacerError(f"vLLM has {num_ranks} EP ranks, topology {topology.name} has"
                          f" {topology.num_gpus} GPUs", hint=f"set topology= in {ENV}")
    if tuple(weight.shape)[-1:] != (model.num_experts,) or (
            num_groups != model.num_groups):
        raise PlacerError(f"vLLM serves {weight.shape[-1]} experts in {num_groups} groups,"
                          f" {model.name} has {model.num_experts} in {model.num_groups}",
                          hint=f"set model= in {ENV}")
    if tuple(old.shape) != (weight.shape[0], num_replicas) or bool((old < 0).any()):
        raise PlacerError(f"the deployed map {tuple(old.shape)} is not [layers, "
                          f"{num_replicas}] with an expert in every slot",
                          hint="placer does not follow elastic EP's scale changes")

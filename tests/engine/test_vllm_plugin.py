"""placer's policy inside the released vLLM (the pinned package, on CPU): loaded by vLLM's
own plugin loader, found where vLLM looks its EPLB policy up, called through vLLM's
interface on DeepSeek-V3-shaped tensors, and vLLM's default policy whenever placer cannot
decide."""

from __future__ import annotations

import json
import logging
import os
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

import placer
import placer.online.vllm as plugin
from placer.model import load_model
from placer.online import OnlineSettings, rebalance
from placer.online.config import ENV, read_config
from placer.placement import Placement
from placer.placement.migration import copy_bytes, layer_moves
from placer.replay.deploy import placer_launch
from placer.replay.policies import OnlinePolicy
from placer.topology import load_topology

# The tier runs in vLLM's own environment (tests/engine/run.sh, make test-engine); in the
# main one, without vllm, it is skipped, unless PLACER_REQUIRE_VLLM=1 (then it fails)
try:
    import torch
    import vllm
    import vllm.plugins
    from vllm.config import EPLBConfig
    from vllm.distributed.eplb.policy import (
        EPLB_POLICIES,
        AbstractEplbPolicy,
        DefaultEplbPolicy,
    )
except ImportError:
    if os.environ.get("PLACER_REQUIRE_VLLM") == "1":
        raise
    pytest.skip("vllm is not installed here: the engine tier runs in its own environment"
                " (make test-engine)", allow_module_level=True)

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
#: DeepSeek-V3 on 4 x DGX H100: 256 experts in 8 groups, 32 EP ranks of 9 slots, 4 nodes
EXPERTS, GROUPS, RANKS, SLOTS, NODES = 256, 8, 32, 9, 4
REPLICAS = RANKS * SLOTS
CONFIG = "topology=4x-dgx-h100,model=deepseek-v3,max_moves=256,horizon=1000"


@pytest.fixture
def load_plugins(monkeypatch):
    """vLLM's own loader run afresh with :data:`ENV` set to a value (None: unset); vLLM's
    policy table as it was afterwards."""
    saved = dict(EPLB_POLICIES)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)

    def load(value: str | None) -> dict:
        if value is None:
            monkeypatch.delenv(ENV, raising=False)
        else:
            monkeypatch.setenv(ENV, value)
        monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
        vllm.plugins.load_general_plugins()
        return EPLB_POLICIES

    yield load
    EPLB_POLICIES.clear()
    EPLB_POLICIES.update(saved)


@pytest.fixture
def placer_log():
    """The lines logged under ``vllm.placer`` (vLLM's loggers need not reach the root)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    logger = logging.getLogger("vllm.placer")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def _window(layers: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight [layers, 256] int32, deployed map [layers, 288] int64)``: the deployed map
    is vLLM's default policy's on yesterday's load, the window today's drifted load, as
    vLLM's EplbState holds them."""
    rng = np.random.default_rng(seed)
    yesterday = rng.gamma(0.5, size=(layers, EXPERTS)) * 1_000
    today = yesterday * rng.gamma(2.0, 0.5, size=(layers, EXPERTS))
    deployed = DefaultEplbPolicy.rebalance_experts(
        torch.tensor(yesterday.round(), dtype=torch.int32), REPLICAS, GROUPS, NODES, RANKS)
    return torch.tensor(today.round(), dtype=torch.int32), deployed


def _call(policy, weight: torch.Tensor, deployed: torch.Tensor) -> torch.Tensor:
    """The call vLLM's EplbState makes at a rearrangement (eplb_state.py, async_worker.py)."""
    return policy.rebalance_experts(weight, REPLICAS, GROUPS, NODES, RANKS, deployed)


def test_the_pinned_release_runs_this_checkout() -> None:
    assert vllm.__version__ == "0.33.0"
    assert Path(placer.__file__).resolve().is_relative_to(REPO)
    [entry] = [e for e in entry_points(group="vllm.general_plugins") if e.name == plugin.PLUGIN]
    assert entry.value == "placer.online.vllm:register"


def test_unset_vllm_keeps_its_default_policy(load_plugins) -> None:
    assert load_plugins(None)["default"] is DefaultEplbPolicy


def test_vllm_finds_placers_policy_where_it_looks_it_up(load_plugins, placer_log) -> None:
    policies = load_plugins(CONFIG)
    config = EPLBConfig(use_async=True)  # async EPLB, the default, takes "default" only
    policy = policies[config.policy]  # as EplbState looks it up
    assert policy is not DefaultEplbPolicy and issubclass(policy, AbstractEplbPolicy)
    assert policy.placer_config.topology.num_gpus == RANKS
    assert any("replaces vLLM's default" in line for line in placer_log)
    load_plugins(CONFIG)  # vLLM may load plugins again: placer's policy is not stacked
    assert policies["default"] is policy


@pytest.mark.parametrize("layers", [58, 59])  # DeepSeek-V3's MoE layers, with MTP's
def test_a_decision_through_vllms_interface(load_plugins, placer_log, layers) -> None:
    policy = load_plugins(CONFIG)["default"]
    weight, deployed = _window(layers)
    new = _call(policy, weight, deployed)
    assert isinstance(new, torch.Tensor) and new.dtype == torch.int64
    assert new.device == torch.device("cpu") and tuple(new.shape) == (layers, REPLICAS)
    new_np, old_np = new.numpy(), deployed.numpy()
    for row in new_np:  # every logical expert has a replica, counts sum to the slots
        counts = np.bincount(row, minlength=EXPERTS)
        assert counts.size == EXPERTS and (counts >= 1).all() and counts.sum() == REPLICAS
    # an expert that stays on its GPU keeps its slot
    for a, b in zip(new_np.reshape(-1, RANKS, SLOTS), old_np.reshape(-1, RANKS, SLOTS),
                    strict=True):
        for mine, theirs in zip(a, b, strict=True):
            for e in set(mine.tolist()) & set(theirs.tolist()):
                kept = min((mine == e).sum(), (theirs == e).sum())
                assert ((mine == e) & (theirs == e)).sum() == kept
    # the library's decision on the same arrays, and the bytes the replay charges for it
    model, topology = load_model("deepseek-v3"), load_topology("4x-dgx-h100")
    record = rebalance(weight.numpy(), old_np, topology=topology, model=model,
                       settings=read_config(CONFIG).settings)
    assert (record.physical_to_logical == new_np).all()
    ids = np.arange(layers)
    after, before = Placement(new_np, ids, EXPERTS, RANKS), Placement(old_np, ids, EXPERTS,
                                                                      RANKS)
    expert_bytes = float(model.expert_bytes(model.default_dtype))
    local, remote = copy_bytes(after, before, expert_bytes, topology.node_of_gpu)
    moves = int(layer_moves(after, before).sum())
    assert 0 < moves <= 256 and record.moves == moves
    assert record.bytes == pytest.approx(float(local.sum() + remote.sum()))
    assert record.bytes == pytest.approx(moves * expert_bytes)  # the replay's Rebalance.gb
    [line] = [line for line in placer_log if "placer EPLB:" in line]
    assert line.startswith("INFO") and f"{moves} moves" in line
    assert f"{moves * expert_bytes / 1e9:.2f} GB" in line and "predicted gain" in line


def test_a_configuration_for_another_cluster_falls_back(load_plugins, placer_log) -> None:
    policy = load_plugins("topology=2x-dgx-h100,model=deepseek-v3")["default"]
    weight, deployed = _window(58, seed=1)
    got = _call(policy, weight, deployed)
    assert torch.equal(got, _call(DefaultEplbPolicy, weight, deployed))
    [line] = [line for line in placer_log if line.startswith("WARNING")]
    assert "vLLM has 32 EP ranks" in line and "default policy decides" in line


def test_a_bad_configuration_leaves_vllm_its_default(load_plugins, placer_log) -> None:
    assert load_plugins(CONFIG + ",horizn=5")["default"] is DefaultEplbPolicy
    [line] = [line for line in placer_log if line.startswith("WARNING")]
    assert "horizn" in line and "vLLM's default policy runs" in line


def test_an_error_inside_placer_falls_back(load_plugins, placer_log, monkeypatch) -> None:
    policy = load_plugins(CONFIG)["default"]

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in placer")

    monkeypatch.setattr(plugin, "rebalance", broken)
    weight, deployed = _window(58, seed=2)
    assert torch.equal(_call(policy, weight, deployed),
                       _call(DefaultEplbPolicy, weight, deployed))
    assert any("RuntimeError: a bug in placer" in line for line in placer_log)


def test_a_map_with_empty_slots_falls_back(load_plugins, placer_log) -> None:
    policy = load_plugins(CONFIG)["default"]
    weight, deployed = _window(58, seed=3)
    deployed = deployed.clone()
    deployed[0, 5] = -1  # what vLLM's elastic EP marks a slot without an expert with
    got = _call(policy, weight, deployed)
    assert torch.equal(got, _call(DefaultEplbPolicy, weight, deployed))
    assert any("with an expert in every slot" in line for line in placer_log)


def test_the_launch_line_is_what_vllm_accepts() -> None:
    line = placer_launch(OnlinePolicy("placer", window=100, interval=100, first=75,
                                      max_moves=64, asynchronous=True),
                         topology="4x-dgx-h100", model="deepseek-v3", redundant=32)
    env = line.split(f"{ENV}='", 1)[1].split("'", 1)[0]
    assert read_config(env).settings.max_moves == 64
    config = EPLBConfig(**json.loads(line.split("--eplb-config '", 1)[1].split("'", 1)[0]))
    assert (config.window_size, config.step_interval, config.use_async) == (100, 100, True)
    assert config.policy == "default"  # the entry placer's policy takes
    assert OnlineSettings().horizon == EPLBConfig().window_size


def test_slots_are_kept_as_vllms_default_policy_keeps_them() -> None:
    """placer's keep_slots is vLLM's preserve_intragpu_slots: the same slots kept, the
    same slots filled, in the same order (duplicates included)."""
    from placer.placement.align import keep_slots

    rng = np.random.default_rng(5)
    for _ in range(200):
        gpus, slots, experts = (int(x) for x in rng.integers(1, 6, size=3))
        new = rng.integers(0, experts, size=(3, gpus * slots))
        old = rng.integers(0, experts, size=(3, gpus * slots))
        theirs = DefaultEplbPolicy.preserve_intragpu_slots(new, gpus, old)
        mine = np.stack([keep_slots(n, o, gpus) for n, o in zip(new, old, strict=True)])
        assert (mine == theirs).all()

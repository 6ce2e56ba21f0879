"""The online policy's settings for an engine, from a YAML file or one environment value.

An engine plugin reads its settings from :data:`ENV` (``PLACER_VLLM_POLICY``): either the
path of a YAML file, or the same keys inline, ``key=value`` pairs joined by commas::

    PLACER_VLLM_POLICY=/etc/placer/online.yaml
    PLACER_VLLM_POLICY='topology=4x-dgx-h100,model=deepseek-v3,max_moves=64,horizon=1000'

The keys (a file holds them as a mapping)::

    topology: 4x-dgx-h100   # required: a preset or a topology file; its GPUs are the EP ranks
    model: deepseek-v3      # required: a preset, a model file or a Hugging Face config.json
    max_moves: 64           # weight moves per rebalance (default: none, as many as pay)
    horizon: 1000           # steps the moves must pay for their copy within (default 1000)
    workload: decode        # decode or prefill: the regime candidates are judged under
    dtype: fp8              # the experts' dtype (default: the model's)
    async: true             # weights move in the background (vLLM's default); false: a stall

Unset or empty, the plugin does nothing: installing placer never changes an engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from placer.errors import UsageError
from placer.io.yaml_schema import Section, parse_yaml, read_yaml
from placer.model import DTYPES, ModelSpec, load_model
from placer.online.rebalance import DEFAULT_HORIZON, OnlineSettings
from placer.regime import Regime
from placer.topology import Topology, load_topology

#: The environment variable that turns placer's policy on inside vLLM and configures it.
ENV = "PLACER_VLLM_POLICY"
#: Keys of a configuration, in the order :func:`inline` writes them.
KEYS = ("topology", "model", "max_moves", "horizon", "workload", "dtype", "async")


@dataclass(frozen=True)
class PolicyConfig:
    """What the plugin runs: placer's policy for this cluster and model, these settings.

    Attributes
    ----------
    topology, model: the cluster served (its GPUs are the EP ranks) and the model.
    settings: budget, horizon, regime, dtype, asynchronous copies.
    source: where the configuration was read (a file, or :data:`ENV`).
    """

    topology: Topology
    model: ModelSpec
    settings: OnlineSettings
    source: str


def read_config(value: str) -> PolicyConfig:
    """The configuration :data:`ENV` holds: a YAML file's path, or ``key=value`` pairs
    joined by commas (module docstring).  Raises a :class:`~placer.errors.PlacerError`
    naming the key (and the file's line) on a bad value."""
    text = value.strip()
    if "=" in text:
        pairs = [p.strip() for p in text.split(",") if p.strip()]
        bad = [p for p in pairs if "=" not in p]
        if bad:
            raise UsageError(f"{ENV}: expected key=value, got {bad[0]!r}", where=ENV,
                             hint="e.g. topology=4x-dgx-h100,model=deepseek-v3,max_moves=64")
        lines = "\n".join(f"{k.strip()}: {v.strip()}" for k, v in
                          (p.split("=", 1) for p in pairs))
        doc = parse_yaml(lines + "\n", ENV, UsageError)
    else:
        doc = read_yaml(Path(text), UsageError)
    return _config(doc.root(), doc.source)


def _config(root: Section, source: str) -> PolicyConfig:
    """Each key read and checked; an unknown key fails (with a "did you mean")."""
    topology = load_topology(root.string("topology"))
    model = load_model(root.string("model"))
    budget = root.raw("max_moves", None)
    max_moves = None if budget in (None, "none") else root.integer("max_moves", minimum=0)
    horizon = root.integer("horizon", DEFAULT_HORIZON, minimum=1)
    workload = root.string("workload", "decode", choices=("decode", "prefill"))
    dtype = root.raw("dtype", None)
    if dtype is not None:
        dtype = root.string("dtype", choices=DTYPES)
    asynchronous = root.boolean("async", True)
    root.done()
    settings = OnlineSettings(max_moves=max_moves, horizon=horizon,
                              regime=Regime("vllm", workload), dtype=dtype,
                              asynchronous=asynchronous)
    return PolicyConfig(topology, model, settings, source)


def inline(*, topology: str, model: str, max_moves: int | None = None,
           horizon: int | None = None, workload: str | None = None, dtype: str | None = None,
           asynchronous: bool | None = None) -> str:
    """The inline form of a configuration (what :data:`ENV` may hold), the keys given.

    >>> inline(topology="4x-dgx-h100", model="deepseek-v3", max_moves=64, horizon=1000)
    'topology=4x-dgx-h100,model=deepseek-v3,max_moves=64,horizon=1000'
    """
    values = {"topology": topology, "model": model, "max_moves": max_moves,
              "horizon": horizon, "workload": workload, "dtype": dtype,
              "async": None if asynchronous is None else str(asynchronous).lower()}
    for key in ("topology", "model"):
        if "," in values[key] or "=" in values[key]:  # type: ignore[operator]
            raise UsageError(f"{key} {values[key]!r} cannot be written inline",
                             where=key, hint="name it in a configuration file instead")
    return ",".join(f"{k}={values[k]}" for k in KEYS if values[k] is not None)

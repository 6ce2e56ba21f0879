"""Rebalancing policies a replay compares, and how they are written on the command line.

A policy says which placement serves each step of a replay and when it changes:

``static:FILE`` / ``static:default``
    one placement for the whole replay: a placement JSON (a ``placer plan`` fitted on
    earlier windows, or what ``placer import`` read from an engine's file), or the
    engines' default layout (``default``: expert ``e`` on GPU ``e // (E / G)``, redundant
    slots as vLLM's EPLB starts them).
``eplb:window=W,interval=I[,redundant=R][,async][,first=F][,layers=N][,decide-ms=D]``
    what the engines do online: every ``I`` steps (from step ``F``, default ``I``), the
    reference EPLB on the load of the last ``W`` steps; ``async`` decides and copies the
    new layout in the background, ``layers`` per step (the old one serving meanwhile),
    else serving stops while it decides and the weights move.
``placer:window=W,interval=I[,max-moves=M][,horizon=H][,async][,first=F][,layers=N][,decide-ms=D]``
    placer's online re-plan at the same cadence: from the deployed placement, the moves
    (or, where a burst moved the load too far for single moves, a layer's whole EPLB
    re-placement) that pay for their copy within ``H`` steps (default: the window: the
    load of the last ``W`` steps is taken to hold for as long again), greedily by what
    each is worth, at most ``M`` per rebalance (:mod:`placer.replay.decide`).
``oracle:interval=I``
    foresight, a bound: every ``I`` steps and for each layer, the fastest of EPLB and
    placer fitted on the coming ``I`` steps themselves and of what every other policy
    served in them, moved for free (:mod:`placer.replay.bound`).

A decision takes time: ``decide-ms`` is its compute time per MoE layer, milliseconds
(default: placer's measured as the replay decides; the engines' EPLB
:data:`EPLB_MS_PER_LAYER`).  Asynchronous, the decision lands once that much serving
time has passed; synchronous, serving stops for it (:mod:`placer.replay.timeline`).

:func:`parse_policy` reads one such string; :data:`ENGINE_DEFAULTS` names the engines'
own settings and the source each comes from (docs/replay.md).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path

from placer.errors import Param, UsageError

#: Policy kinds, and the keys each takes (``True``: a flag without a value).
KEYS: dict[str, dict[str, bool]] = {
    "static": {},
    "eplb": {"window": False, "interval": False, "redundant": False, "async": True,
             "first": False, "layers": False, "decide-ms": False},
    "placer": {"window": False, "interval": False, "max-moves": False, "horizon": False,
               "async": True, "first": False, "layers": False, "decide-ms": False},
    "oracle": {"interval": False},
}

#: The reference EPLB's compute time per MoE layer, milliseconds: deepseek-ai/EPLB's
#: algorithm (placer/planning/solvers/eplb/reference.py) re-placing the 58 layers of the
#: DeepSeek-V3 shape onto 288 slots of 32 GPUs in 4 nodes took 31-37 ms on one core here
#: (numpy; vLLM runs the same algorithm on CPU tensors, SGLang on GPU or CPU).  A fixed
#: figure so that replays are reproducible; ``decide-ms`` overrides it.
EPLB_MS_PER_LAYER = 0.6

#: What the engines run when online rebalancing is on, as eplb keys (docs/replay.md):
#: vLLM ``EPLBConfig`` (vllm/config/parallel.py: window_size 1000, step_interval 3000,
#: async by default since vLLM PR #43219, the first rearrangement at step_interval -
#: step_interval // 4, vllm/distributed/eplb/eplb_state.py; one layer moved per step,
#: async_worker.py); SGLang ``--eplb-rebalance-num-iterations`` 1000 with a recorder
#: buffer of as many forward passes, moved synchronously (python/sglang/srt/eplb/
#: eplb_manager.py, expert_location_updater.py); TensorRT-LLM's online load balancer
#: re-places ``layer_updates_per_iter`` layers per iteration in the background
#: (moe_load_balancer.py; 2 in its wide-EP example).
ENGINE_DEFAULTS: dict[str, str] = {
    "vllm": "eplb:window=1000,interval=3000,first=2250,async,layers=1",
    "sglang": "eplb:window=1000,interval=1000",
    "trtllm": "eplb:window=1,interval=29,async,layers=2",
}


@dataclass(frozen=True)
class StaticPolicy:
    """One placement for the whole replay: ``path`` (placement JSON) or None (the
    engines' default layout)."""

    path: Path | None = None

    @property
    def label(self) -> str:
        return f"static:{self.path if self.path is not None else 'default'}"


@dataclass(frozen=True)
class OnlinePolicy:
    """A policy that rebalances every ``interval`` steps from step ``first``.

    Attributes
    ----------
    kind: ``eplb`` (the reference EPLB re-places every layer) or ``placer`` (moves from
        the deployed placement that pay for their copy).
    window: steps of recorded load the decision reads (the last ``window`` steps).
    interval: steps between rebalances.
    first: the step of the first rebalance.
    redundant: redundant experts per layer (eplb; None = the replay's).
    max_moves: at most this many weight moves per rebalance (placer; None = no budget
        beyond what pays).
    horizon: steps over which a move must pay for its copy (placer; the window).
    decide_ms: compute time of a decision per MoE layer, milliseconds (None: placer's
        measured, eplb's :data:`EPLB_MS_PER_LAYER`).
    asynchronous: copy in the background (the old layout serves meanwhile), ``layers``
        layers per step; else serving stops while the weights move.
    layers: layers whose weights move per step when asynchronous.
    """

    kind: str
    window: int
    interval: int
    first: int
    redundant: int | None = None
    max_moves: int | None = None
    asynchronous: bool = False
    layers: int = 1
    text: str = ""
    horizon: int | None = None
    decide_ms: float | None = None

    @property
    def label(self) -> str:
        return self.text or f"{self.kind}:window={self.window},interval={self.interval}"

    @property
    def decision_source(self) -> str:
        """Where the decision time charged comes from, in words."""
        if self.decide_ms is not None:
            return f"{self.decide_ms:g} ms a layer (decide-ms)"
        if self.kind == "eplb":
            return f"{EPLB_MS_PER_LAYER:g} ms a layer (the reference EPLB, measured once)"
        return "measured as the replay decides"


@dataclass(frozen=True)
class OraclePolicy:
    """Every ``interval`` steps, per layer, the fastest of EPLB and placer fitted on the
    coming ``interval`` steps themselves and of what every other policy served in them,
    moved for free: a bound, not a deployable policy."""

    interval: int
    text: str = ""

    @property
    def label(self) -> str:
        return self.text or f"oracle:interval={self.interval}"


Policy = StaticPolicy | OnlinePolicy | OraclePolicy


def policy_help() -> str:
    """The policies and their keys, for hints."""
    parts = []
    for kind, keys in KEYS.items():
        if kind == "static":
            parts.append("static:FILE | static:default")
        else:
            listed = ",".join(k if flag else f"{k}=N" for k, flag in keys.items())
            parts.append(f"{kind}:{listed}")
    return "; ".join(parts)


def parse_policy(text: str, *, where: str | None = None) -> Policy:
    """A policy from its written form (module docstring), checked.

    >>> parse_policy("eplb:window=100,interval=50,async").asynchronous
    True
    >>> parse_policy("static:default").label
    'static:default'
    """
    where = where or Param("policy")
    kind, _, rest = text.strip().partition(":")
    if kind not in KEYS:
        close = difflib.get_close_matches(kind, list(KEYS), n=1)
        guess = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"unknown policy {text!r}", where=where,
                         hint=f"{guess}policies: {policy_help()}")
    if kind == "static":
        if not rest:
            raise UsageError("static needs a placement", where=where,
                             hint="static:FILE (placement JSON) or static:default")
        return StaticPolicy(None if rest == "default" else Path(rest))
    values = _keys(kind, rest, text, where)
    if kind == "oracle":
        interval = _count(values, "interval", text, where, None)
        return OraclePolicy(interval, text=text.strip())
    interval = _count(values, "interval", text, where, None)
    window = _count(values, "window", text, where, interval)
    first = _count(values, "first", text, where, interval, minimum=0)
    return OnlinePolicy(
        kind=kind, window=window, interval=interval, first=first,
        redundant=_count(values, "redundant", text, where, -1, minimum=0)
        if "redundant" in values else None,
        max_moves=_count(values, "max-moves", text, where, -1, minimum=0)
        if "max-moves" in values else None,
        asynchronous="async" in values,
        layers=_count(values, "layers", text, where, 1),
        text=text.strip(),
        horizon=_count(values, "horizon", text, where, window) if kind == "placer" else None,
        decide_ms=_milliseconds(values, "decide-ms", text, where)
        if "decide-ms" in values else None,
    )


def _keys(kind: str, rest: str, text: str, where: str) -> dict[str, str]:
    """``key=value`` (or a bare flag) pairs of ``rest``, each a key of ``kind``."""
    allowed = KEYS[kind]
    values: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            guess = f"did you mean {close[0]}? " if close else ""
            raise UsageError(f"unknown key {key!r} in policy {text!r}", where=where,
                             hint=f"{guess}{kind} takes: {', '.join(allowed)}"
                             f" (policies: {policy_help()})")
        if allowed[key] and eq:
            raise UsageError(f"{key} takes no value in policy {text!r}", where=where,
                             hint=f"write the bare {key}, e.g. {_example(kind, rest, key)}")
        if not allowed[key] and not eq:
            raise UsageError(f"{key} needs a value in policy {text!r}", where=where,
                             hint=f"write {key}=N, e.g. {_example(kind, rest, f'{key}=100')}")
        if key in values:
            raise UsageError(f"{key} is given twice in policy {text!r}", where=where,
                             hint="give each key once")
        values[key] = value.strip()
    return values


def _split(text: str) -> tuple[str, str]:
    """``kind:rest`` -> ``(kind, rest)``."""
    kind, _, rest = text.strip().partition(":")
    return kind, rest


def _example(kind: str, rest: str, item: str) -> str:
    """The policy ``kind:rest`` with ``item`` in place of its key's written form (an
    example that parses, for hints).

    >>> _example("eplb", "", "interval=100")
    'eplb:interval=100'
    >>> _example("eplb", "window=5,async=1", "async")
    'eplb:window=5,async'
    """
    key = item.partition("=")[0]
    kept = [p.strip() for p in rest.split(",")
            if p.strip() and p.partition("=")[0].strip() != key]
    return f"{kind}:{','.join([*kept, item])}"


def _count(values: dict[str, str], key: str, text: str, where: str, default: int | None,
           *, minimum: int = 1) -> int:
    """Whole number ``key`` of ``values`` (>= ``minimum``), or ``default``."""
    if key not in values:
        if default is None:
            example = _example(*_split(text), f"{key}=100")
            raise UsageError(f"policy {text!r} needs {key}", where=where,
                             hint=f"add {key}=N (steps), e.g. {example}")
        return default
    raw = values[key]
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{key} must be a whole number in policy {text!r}, got {raw!r}",
                         where=where, hint=f"for example {key}=100") from None
    if value < minimum:
        raise UsageError(f"{key} must be at least {minimum} in policy {text!r}, got {value}",
                         where=where, hint=f"{key}={max(minimum, 1)} or more")
    return value


def _milliseconds(values: dict[str, str], key: str, text: str, where: str) -> float:
    """Non-negative number ``key`` of ``values`` (milliseconds)."""
    raw = values[key]
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{key} must be a number of milliseconds in policy {text!r}, got"
                         f" {raw!r}", where=where, hint=f"for example {key}=0.6") from None
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"{key} must be at least 0 in policy {text!r}, got {raw}",
                         where=where, hint=f"for example {key}=0.6")
    return value


#: Keys a sweep may vary (of the ``eplb`` policies).
SWEEP_KEYS = ("interval", "window", "redundant")


def parse_sweep(items: list[str]) -> dict[str, tuple[int, ...]]:
    """``["interval=100,200,400", "window=100,1000"]`` -> ``{key: values}``.

    >>> parse_sweep(["interval=50,100", "window=200"])
    {'interval': (50, 100), 'window': (200,)}
    """
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if key not in SWEEP_KEYS or not eq:
            close = difflib.get_close_matches(key, list(SWEEP_KEYS), n=1)
            guess = f"did you mean {close[0]}? " if close else ""
            raise UsageError(f"cannot sweep {item!r}", where=Param("sweep"),
                             hint=f"{guess}sweep KEY=A,B,C with KEY one of"
                             f" {', '.join(SWEEP_KEYS)}, e.g. interval=100,300,1000")
        try:
            values = tuple(int(v) for v in raw.split(",") if v.strip())
        except ValueError:
            raise UsageError(f"{key} values must be whole numbers, got {raw!r}",
                             where=Param("sweep"), hint=f"for example {key}=100,300") from None
        if not values or min(values) < (0 if key == "redundant" else 1):
            raise UsageError(f"{key} needs values of at least"
                             f" {0 if key == 'redundant' else 1}, got {raw!r}",
                             where=Param("sweep"), hint=f"for example {key}=100,300")
        out[key] = values
    return out


def swept(policies: list[Policy], sweep: dict[str, tuple[int, ...]]) -> list[Policy]:
    """``policies`` with each ``eplb`` policy replaced by one per combination of the
    sweep's values (in the given order), others kept; duplicates dropped."""
    if not sweep:
        return policies
    out: list[Policy] = []
    for policy in policies:
        if not (isinstance(policy, OnlinePolicy) and policy.kind == "eplb"):
            out.append(policy)
            continue
        grid: list[dict[str, int]] = [{}]
        for key, values in sweep.items():
            grid = [{**g, key: v} for g in grid for v in values]
        for g in grid:
            interval = g.get("interval", policy.interval)
            first = policy.first if "interval" not in g else interval
            text = _written("eplb", window=g.get("window", policy.window), interval=interval,
                            redundant=g.get("redundant", policy.redundant),
                            asynchronous=policy.asynchronous, layers=policy.layers,
                            decide_ms=policy.decide_ms)
            out.append(parse_policy(text) if first == interval else
                       parse_policy(f"{text},first={first}"))
    unique: dict[str, Policy] = {}
    for p in out:
        unique.setdefault(p.label, p)
    return list(unique.values())


def _written(kind: str, *, window: int, interval: int, redundant: int | None,
             asynchronous: bool, layers: int, decide_ms: float | None = None) -> str:
    """A policy's written form."""
    text = f"{kind}:window={window},interval={interval}"
    if redundant is not None:
        text += f",redundant={redundant}"
    if asynchronous:
        text += ",async" + (f",layers={layers}" if layers != 1 else "")
    if decide_ms is not None:
        text += f",decide-ms={decide_ms:g}"
    return text

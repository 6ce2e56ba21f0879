"""Foresight as a bound: the oracle made never slower than any policy it is compared with.

The oracle's own layouts (EPLB and placer's moves fitted on the coming interval itself,
:func:`placer.replay.decide.oracle_layout`) are the fastest in expectation on that
interval's load, not on its steps as timed, and another policy may serve a layer better
for part of an interval.  So once every timeline is timed, :func:`bounded` takes, for
each interval and each layer, whichever candidate served the layer fastest over the
interval's steps: the oracle's own layout, or what any other policy served in it (its
layouts as they changed, the static plans' included), all moved for free.  Summed over
layers and averaged over steps, the oracle's time is then at most every other policy's
serving time, hence at most its step time (stalls and background copies are never
negative): a bound on every row, whatever its cadence.  Its p99 is not bounded (a step's
maximum is not a sum).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from placer.replay.timeline import Rebalance, Setting, Timeline
from placer.replay.timing import Timed


@dataclass(frozen=True)
class _Rows:
    """One timeline's rows of one layer over the replay: ``(step, row)`` from step 0
    on, in step order."""

    entries: list[tuple[int, np.ndarray]]

    @classmethod
    def of(cls, line: Timeline, layer: int) -> _Rows:
        entries = [(0, line.initial.physical_to_logical[layer])]
        entries += [(step, row) for step, at, row in line.changes if at == layer]
        return cls(entries)

    def within(self, first: int, stop: int) -> list[tuple[int, np.ndarray]]:
        """The row serving step ``first``, then each change before ``stop``."""
        at = max(i for i, (step, _) in enumerate(self.entries) if step <= first)
        out = [(first, self.entries[at][1])]
        out += [(s, r) for s, r in self.entries[at + 1 :] if s < stop]
        return out


def bounded(oracle: Timeline, timed: Timed, others: Sequence[tuple[Timeline, Timed]],
            interval: int, setting: Setting) -> tuple[Timeline, Timed]:
    """The oracle's timeline and times, each layer of each ``interval`` steps served by
    the fastest candidate (module docstring); the oracle's own on ties."""
    candidates = [(oracle, timed), *others]
    steps, layers = timed.layer_time_us.shape
    times = np.stack([t.layer_time_us for _, t in candidates])  # [C, steps, layers]
    hots = np.stack([t.hot_shard for _, t in candidates])
    out_times = np.full((steps, layers), np.nan)
    out_hot = np.full((steps, layers), np.nan)
    rows = [[_Rows.of(line, layer) for layer in range(layers)] for line, _ in candidates]
    slots = oracle.initial.slots_per_gpu
    deployed = oracle.initial.physical_to_logical.copy()
    changes: list[tuple[int, int, np.ndarray]] = []
    moves_at: dict[int, tuple[int, set[int]]] = {}
    for first in range(0, steps, interval):
        stop = min(steps, first + interval)
        score = np.nansum(times[:, first:stop], axis=1)  # [C, layers]; 0 where all NaN
        best = np.argmin(score, axis=0)  # the first (the oracle's own) on ties
        for layer in range(layers):
            c = int(best[layer])
            out_times[first:stop, layer] = times[c, first:stop, layer]
            out_hot[first:stop, layer] = hots[c, first:stop, layer]
            for step, row in rows[c][layer].within(first, stop):
                if np.array_equal(row, deployed[layer]):
                    continue
                count, touched = moves_at.get(step, (0, set()))
                moves_at[step] = (count + _gained(deployed[layer], row, slots),
                                  touched | {layer})
                changes.append((step, layer, row.copy()))
                deployed[layer] = row
    expert_bytes = float(setting.model.expert_bytes(setting.dtype))
    rebalances = [Rebalance(step, count, count * expert_bytes / 1e9, len(touched), 0.0, 0.0,
                            step)
                  for step, (count, touched) in sorted(moves_at.items())]
    changes.sort(key=lambda c: c[0])
    line = Timeline(oracle.label, oracle.initial, changes, np.zeros(steps), np.zeros(steps),
                    rebalances, [], oracle.start)
    return line, Timed(out_times, out_hot)


def _gained(old: np.ndarray, new: np.ndarray, slots_per_gpu: int) -> int:
    """Expert weights GPUs gain going from row ``old`` to ``new`` (a move each)."""
    gpu = np.arange(old.size) // slots_per_gpu
    before = set(zip(old.tolist(), gpu.tolist(), strict=True))
    after = set(zip(new.tolist(), gpu.tolist(), strict=True))
    return len(after - before)

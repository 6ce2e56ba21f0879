"""Several placements judged on the same parts of one trace: the evaluate command's loop.

:func:`evaluate_many` evaluates every placement on every part (by default the fitted and
the held-out windows, :func:`placer.stats.windows.evaluation_parts`) with the same parameters,
so their figures compare; warnings are said once, and the round-robin order findings of
all (placement, part) pairs are gathered into one warning.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from placer.errors import PlacerError, PlacerWarning
from placer.evaluate.core import EvalParams, Evaluation, evaluate
from placer.evaluate.dispatch import OrderBias, OrderBiasWarning, order_bias_message
from placer.evaluate.params import JudgedSample, judged_part, regime_params
from placer.placement import Placement
from placer.regime import Regime
from placer.stats import RoutingData
from placer.stats.windows import OpenRange, WindowRange, evaluation_parts

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.topology import Topology


@dataclass(frozen=True)
class PartEvaluation:
    """The placements judged on one part of the trace.

    Attributes
    ----------
    name: ``"fit"``, ``"held-out"`` or ``"all"``.
    windows: ``(start, stop)`` of the part.
    evaluations: ``(label, Evaluation)`` per placement, in the order given.
    judged_sample: what was judged of a trace read as a sample
        (:func:`placer.evaluate.params.judged_part`), or None when it was kept whole.
    """

    name: str
    windows: WindowRange
    evaluations: tuple[tuple[str, Evaluation], ...]
    judged_sample: JudgedSample | None = None

    @property
    def source(self) -> str:
        """Where the batches came from (the first evaluation's ``source``)."""
        return self.evaluations[0][1].source if self.evaluations else "trace"


def evaluate_many(
    placements: Sequence[tuple[str, Placement]],
    routing: RoutingData,
    topology: Topology,
    model: ModelSpec,
    params: EvalParams | Regime,
    *,
    dtype: str | None = None,
    fit: OpenRange | None = None,
    held_out: OpenRange | None = None,
    on_start: Callable[[str, str, WindowRange], None] | None = None,
) -> list[PartEvaluation]:
    """Evaluate each ``(label, placement)`` on each part of the trace.

    ``params``: a :class:`~placer.regime.Regime` is judged as every command judges it
    (:func:`placer.evaluate.params.regime_params` for each part, the per-token trace
    replayed unless :func:`~placer.evaluate.params.replay_or_sample` says it is too large,
    a trace read as a sample cut to whole batches of the part:
    :func:`~placer.evaluate.params.judged_part`; ``dtype`` the experts');
    :class:`EvalParams` are used as given, their windows set to each part's.  ``fit`` /
    ``held_out``: the parts as given (see :func:`placer.stats.windows.evaluation_parts`
    for the default split).
    ``on_start(label, part, windows)`` is called before each evaluation (progress). A
    PlacerError of one evaluation names the placement's label when it names no place of
    its own.
    """
    parts = evaluation_parts(routing.stats.num_windows, fit, held_out)
    relay = _WarningRelay()
    out = []
    for part, windows in parts:
        part_routing, judged = routing, None
        if isinstance(params, Regime):
            part_routing, part_params, judged = judged_part(routing, windows, regime_params(
                params, topology.num_gpus, num_layers=routing.stats.num_layers, dtype=dtype,
                windows=windows))
        else:
            part_params = replace(params, windows=windows)
        done = []
        for label, placement in placements:
            if on_start is not None:
                on_start(label, part, windows)
            try:
                with relay.collect(f"{label} on {part}"):
                    evaluation = evaluate(placement, part_routing, topology, model, part_params)
            except PlacerError as e:
                e.where = e.where or label
                raise
            done.append((label, evaluation))
        out.append(PartEvaluation(part, windows, tuple(done), judged))
    relay.flush()
    return out


class _WarningRelay:
    """Warnings of many evaluations, said once: repeats dropped, and the round-robin
    order findings of every (placement, part) gathered into one warning."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.findings: list[tuple[str, OrderBias]] = []
        self.order: tuple[int, str] = (0, "trace")

    @contextlib.contextmanager
    def collect(self, label: str) -> Iterator[None]:
        """Record the warnings of the block; relay them when it ends (even by an error)."""
        caught: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as recorded:
                warnings.simplefilter("always")
                caught = recorded
                yield
        finally:
            self._relay(label, caught)

    def _relay(self, label: str, caught: list[warnings.WarningMessage]) -> None:
        for w in caught:
            if isinstance(w.message, OrderBiasWarning):
                self.findings.append((label, w.message.bias))
                self.order = (w.message.top_k, w.message.source)
            elif str(w.message) not in self.seen:
                self.seen.add(str(w.message))
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def flush(self) -> None:
        if self.findings:
            warnings.warn(order_bias_message(self.findings, *self.order), PlacerWarning,
                          stacklevel=3)

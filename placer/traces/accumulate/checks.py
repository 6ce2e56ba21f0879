"""Checks of :class:`~placer.traces.accumulate.Accumulator`: :class:`Checks`, a part it
holds, validates what comes in (expert ids, row widths, layer ids, declared metadata,
the selected layers) against the shared :class:`~placer.traces.accumulate.state.TraceState`,
records what the rows tell (``k``, the largest expert id) and words the warnings of
the result.  It grows nothing: the accumulator sizes the counts after a check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from placer import constants
from placer.errors import Param, TraceError, UsageError
from placer.stats import format_ranges
from placer.traces.accumulate.grid import Windows
from placer.traces.accumulate.identity import TokenIdentity
from placer.traces.accumulate.kernels import has_duplicate
from placer.traces.accumulate.limits import LIMITS_HINT, positive_int
from placer.traces.accumulate.state import DECLARED_EXPERTS, DECLARED_TOP_K, TraceState
from placer.traces.accumulate.warmup import WarmupDetector


def raise_duplicate(experts: np.ndarray, where: Callable[[int], str]) -> None:
    """Raise for the first row of ``experts [rows, k]`` naming an expert twice, if any."""
    x = np.asarray(experts, dtype=np.int64)
    dup = np.zeros(x.shape[0], dtype=bool)
    for i in range(x.shape[1] - 1):
        dup |= (x[:, i + 1 :] == x[:, i : i + 1]).any(axis=1) & (x[:, i] >= 0)
    if not dup.any():
        return
    r = int(np.flatnonzero(dup)[0])
    srt = np.sort(x[r])
    e = int(srt[1:][(srt[1:] == srt[:-1]) & (srt[1:] >= 0)][0])
    raise TraceError(
        f"expert {e} appears twice in one token's top-k {x[r].tolist()}",
        where=where(r),
        hint="a token selects distinct experts in a layer",
    )


class Checks:
    """Validation of the input and the warnings of the result.

    ``state`` is read and, for what the rows tell, written; ``windows``, ``warmup`` and
    ``tokens`` (the accumulator's other parts) are only read, for the warnings.
    """

    def __init__(
        self, state: TraceState, *, windows: Windows, warmup: WarmupDetector,
        tokens: TokenIdentity,
    ) -> None:
        self.state = state
        self.windows = windows
        self.warmup = warmup
        self.tokens = tokens

    # -- rows ----------------------------------------------------------------------
    def experts(
        self,
        experts: np.ndarray,
        where: Callable[[int], str],
        layer: np.ndarray,
        *,
        where_flat: Callable[[int], str] | None = None,
        where_layer: Callable[[int], str] | None = None,
        duplicates: bool = True,
    ) -> bool:
        """Validate ``[rows, k]`` expert ids and layer ids; record ``k`` (the first rows
        fix it), the most valid experts in a row and the largest expert id.

        ``layer``: the layer ids of the rows (or of the columns, with ``where_layer``
        naming index ``i`` of it).  ``duplicates``: also look for an expert twice in one
        row (callers that count co-activation may find them there instead, see
        :func:`raise_duplicate`).  Returns whether some entries are -1 (no expert).
        The ids keep their dtype; nothing is copied unless a check fails.
        """
        s = self.state
        k = self._width(experts, where)
        lo = int(layer.min())
        if lo < 0 or int(layer.max()) > constants.MAX_LAYER_ID:
            i = int(np.flatnonzero((layer < 0) | (layer > constants.MAX_LAYER_ID))[0])
            raise TraceError(
                f"layer {int(layer[i])} is out of range [0, {constants.MAX_LAYER_ID}]",
                where=(where_layer or where)(i),
                hint="layer is the model's absolute layer index, from 0",
            )
        mn, mx = self._ids(experts, where_flat or (lambda i: where(i // k)))
        if duplicates and k > 1 and has_duplicate(experts.T):
            raise_duplicate(experts, where)
        has_none = mn < 0
        if has_none:
            valid = (experts >= 0).sum(axis=1)
            most = int(valid.max())
        else:
            most = k
        if s.top_k is not None and most > s.top_k:
            r = int(np.argmax(valid)) if has_none else 0
            raise TraceError(
                f"row selects {most} experts but top_k is {s.top_k} ({s.top_k_from})",
                where=where(r),
                hint="pass the model's top_k (`top_k`), or fix the header",
            )
        s.max_valid = max(s.max_valid, most)
        s.max_expert = max(s.max_expert, mx)
        return has_none

    def _width(self, experts: np.ndarray, where: Callable[[int], str]) -> int:
        """``k``, the experts per row: from 1 to ``MAX_TOP_K``, integer ids, the same in
        every row read (the first rows fix it)."""
        s = self.state
        if experts.ndim != 2 or experts.shape[1] == 0:
            raise TraceError(
                "routing rows need at least one expert", where=where(0),
                hint="each row lists the top_k experts a token selected in a layer",
            )
        k = int(experts.shape[1])
        if k > constants.MAX_TOP_K:
            raise TraceError(
                f"a row lists {k} experts, more than placer handles ({constants.MAX_TOP_K})",
                where=where(0), hint=LIMITS_HINT,
            )
        if not np.issubdtype(experts.dtype, np.integer):
            raise TraceError(
                f"expert ids must be integers, got {experts.dtype}", where=where(0),
                hint="store expert ids as int16 or int32",
            )
        if s.k is None:
            s.k = k
            if s.top_k is not None and k < s.top_k:
                raise TraceError(
                    f"row has {k} experts but top_k is {s.top_k} ({s.top_k_from})",
                    where=where(0),
                    hint="each row lists top_k experts (-1 where none)",
                )
        elif k != s.k:
            raise TraceError(
                f"row has {k} experts but earlier rows have {s.k}",
                where=where(0),
                hint="all rows must select the same number of experts (top_k); pad with -1",
            )
        return k

    def _ids(self, experts: np.ndarray, wf: Callable[[int], str]) -> tuple[int, int]:
        """The smallest and largest expert id, once each id is checked: -1 (none) or an
        expert below ``num_experts`` and ``MAX_EXPERTS``.  ``wf`` names a flat index."""
        declared = self.state.num_experts
        mn = int(experts.min())
        if mn < -1:
            i = int(np.argmin(experts.ravel()))
            raise TraceError(
                f"expert id {mn} is negative",
                where=wf(i),
                hint="expert ids are 0..num_experts-1; -1 marks no expert",
            )
        mx = int(experts.max())
        if declared is not None and mx >= declared:
            i = int(np.flatnonzero(experts.ravel() >= declared)[0])
            raise TraceError(
                f"expert id {int(experts.ravel()[i])} is out of range [0, {declared})",
                where=wf(i),
                hint=f"num_experts is {declared} ({self.state.experts_from}); check the"
                " model, or pass `num_experts`",
            )
        if mx > constants.MAX_EXPERTS - 1:
            i = int(np.argmax(experts.ravel()))
            raise TraceError(
                f"expert id {mx} is more than placer handles ({constants.MAX_EXPERTS} experts)",
                where=wf(i), hint=LIMITS_HINT,
            )
        return mn, mx

    # -- declared metadata ---------------------------------------------------------
    def declare_experts(self, num_experts: Any, where: str) -> int:
        """Check and record a file's ``num_experts`` (against the declared one, the ids
        read so far and ``MAX_EXPERTS``); the accumulator grows the counts to it."""
        s = self.state
        e = _declared_count(
            "num_experts", num_experts, constants.MAX_EXPERTS, (s.num_experts, s.experts_from),
            DECLARED_EXPERTS, "check `model` and `num_experts` against the trace", where,
        )
        if s.max_expert >= e:
            raise TraceError(
                f"num_experts is {e} but expert {s.max_expert} was already read",
                where=where, hint="expert ids are 0..num_experts-1; check the header",
            )
        s.num_experts, s.experts_from = e, where
        return e

    def declare(
        self, where: str, *, top_k: Any, num_layers: Any, model: Any, synthetic: Any
    ) -> None:
        """Check and record the rest of a file's metadata (see
        :meth:`~placer.traces.accumulate.Accumulator.declare`)."""
        s = self.state
        if top_k is not None:
            k = _declared_count(
                "top_k", top_k, constants.MAX_TOP_K, (s.top_k, s.top_k_from), DECLARED_TOP_K,
                "check `model` and `top_k` against the trace", where,
            )
            s.top_k, s.top_k_from = k, where
        if s.top_k is not None and s.num_experts is not None and s.top_k > s.num_experts:
            raise TraceError(
                f"top_k {s.top_k} ({s.top_k_from}) is more than num_experts"
                f" {s.num_experts} ({s.experts_from})",
                where=where, hint="a token selects top_k of the layer's experts; check both",
            )
        if num_layers is not None:
            s.num_layers_declared = positive_int(num_layers, "num_layers", where)
            if s.num_layers_declared > constants.MAX_LAYERS:
                raise TraceError(
                    f"num_layers {s.num_layers_declared} is more than placer handles"
                    f" ({constants.MAX_LAYERS})", where=where, hint=LIMITS_HINT,
                )
        if model is not None:
            s.model = str(model)
        if synthetic is not None:
            if not isinstance(synthetic, bool | np.bool_):
                raise TraceError(
                    f"synthetic must be true or false, got {synthetic!r:.40}", where=where,
                    hint="synthetic: true marks a generated trace",
                )
            s.synthetic = s.synthetic or bool(synthetic)

    # -- the result ----------------------------------------------------------------
    def top_k(self, top_k: int, num_e: int, where: str) -> None:
        """top_k cannot exceed the experts: such statistics would be silently wrong."""
        if top_k > num_e:
            source = self.state.top_k_from or "the data"
            raise TraceError(
                f"top_k {top_k} ({source}) is more than the {num_e} experts of the data",
                where=where,
                hint="check `top_k` (or `model`) and the expert count (`num_experts`)",
            )

    def selected_layers(self, layer_ids: np.ndarray) -> None:
        """Every layer selected (``layers``) has rows."""
        s = self.state
        if s.layer_filter is None:
            return
        missing = sorted(set(s.layer_filter.tolist()) - set(layer_ids.tolist()))
        if missing:
            present = np.array(sorted(s.all_layers | set(layer_ids.tolist())))
            raise UsageError(
                f"layer {missing[0]} has no rows in the trace",
                where=Param("layers"),
                hint=f"layers present: {format_ranges(present)}",
            )

    def warnings(self, load: np.ndarray, layer_ids: np.ndarray) -> list[str]:
        """The result's warnings: the notes so far, then what the statistics
        ``load [windows, layers, experts]`` of ``layer_ids`` and the parts tell."""
        s = self.state
        out = list(s.notes)
        if s.synthetic:
            out.append("the trace declares itself synthetic (synthetic: true): its statistics"
                       " are not measured routing")
        out += self._reading_warnings()
        total = load.sum(axis=0)
        zero = np.argwhere(total == 0)
        if zero.size:
            show = ", ".join(f"layer {int(layer_ids[a])} expert {int(b)}" for a, b in zero[:5])
            more = f" and {len(zero) - 5} more" if len(zero) > 5 else ""
            out.append(
                f"{len(zero)} of {total.size} (layer, expert) pairs were never routed to:"
                f" {show}{more}"
            )
        if (
            s.num_layers_declared is not None
            and s.kind == "tokens"
            and s.num_layers_declared != layer_ids.size
            and s.layer_filter is None
        ):
            out.append(
                f"the header declares {s.num_layers_declared} layers but rows name"
                f" {layer_ids.size} ({format_ranges(layer_ids)})"
            )
        grid = self.windows.grid
        if grid.merged_from is not None and self.windows.mode == "fixed":
            out.append(
                f"window_tokens={grid.merged_from} gave more than {constants.MAX_WINDOWS}"
                f" windows; merged pairwise into windows of {grid.width} tokens"
            )
        return out

    def _reading_warnings(self) -> list[str]:
        """Warm-up passes and repeated tokens."""
        out = []
        rows, layer, where = self.warmup.best
        if self.warmup.rows:
            out.append(
                f"left out {self.warmup.rows} routing rows of a profiling or warm-up pass:"
                f" runs of {constants.WARMUP_RUN_ROWS} or more identical consecutive"
                f" selections in one layer (the longest: {rows} rows for layer {layer},"
                f" ending at {where}); pass `keep_warmup` to count them"
            )
        elif rows >= constants.WARMUP_RUN_ROWS:
            out.append(
                f"{rows} identical consecutive routing rows for layer {layer} (ending at"
                f" {where}): this looks like a profiling or warm-up pass"
            )
        tokens = self.tokens
        if tokens.repeat_rows:
            out.append(
                f"{tokens.repeat_rows} routing rows repeat a (request, token, layer) read"
                f" before (the first at {tokens.repeat_where}): each repeat starts a new"
                f" occurrence of the token ({tokens.repeat_tokens} tokens more), as in a"
                " second pass with the same ids or token numbers that restart"
            )
        return out


def _declared_count(
    name: str, value: Any, limit: int, known: tuple[int | None, str], declared: str,
    declared_hint: str, where: str,
) -> int:
    """A count a file declares (``num_experts``, ``top_k``): a positive int within
    ``limit`` that agrees with what is ``known`` already (value, where it came from;
    ``declared`` when the caller gave it)."""
    count = positive_int(value, name, where)
    if count > limit:
        raise TraceError(f"{name} {count} is more than placer handles ({limit})",
                         where=where, hint=LIMITS_HINT)
    before, source = known
    if before is not None and before != count:
        raise TraceError(
            f"{name} is {count} here but {before} in {source}", where=where,
            hint=declared_hint if source == declared
            else "all inputs of one read must describe the same model",
        )
    return count

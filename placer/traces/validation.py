"""Validation of expert arrays for :class:`~placer.traces.accumulate.Accumulator`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from placer import constants
from placer.errors import TraceError
from placer.traces.kernels import _has_duplicate
from placer.traces.limits import _LIMITS_HINT
from placer.traces.state import _AccumulatorState


class _Validation(_AccumulatorState):
    """Checks of expert ids and row widths."""

    def _check_experts(
        self,
        experts: np.ndarray,
        where: Callable[[int], str],
        layer: np.ndarray,
        *,
        where_flat: Callable[[int], str] | None = None,
        where_layer: Callable[[int], str] | None = None,
        duplicates: bool = True,
    ) -> bool:
        """Validate ``[rows, k]`` expert ids and layer ids; grow the expert capacity.

        ``layer``: the layer ids of the rows (or of the columns, with ``where_layer``
        naming index ``i`` of it).  ``duplicates``: also look for an expert twice in one
        row (callers that count co-activation may find them there instead, see
        :meth:`_raise_duplicate`).  Returns whether some entries are -1 (no expert).
        The ids keep their dtype; nothing is copied unless a check fails.
        """
        k = self._check_width(experts, where)
        lo = int(layer.min())
        if lo < 0 or int(layer.max()) > constants.MAX_LAYER_ID:
            i = int(np.flatnonzero((layer < 0) | (layer > constants.MAX_LAYER_ID))[0])
            raise TraceError(
                f"layer {int(layer[i])} is out of range [0, {constants.MAX_LAYER_ID}]",
                where=(where_layer or where)(i),
                hint="layer is the model's absolute layer index, from 0",
            )
        mn, mx = self._check_ids(experts, where_flat or (lambda i: where(i // k)))
        if duplicates and k > 1 and _has_duplicate(experts.T):
            self._raise_duplicate(experts, where)
        has_none = mn < 0
        if has_none:
            valid = (experts >= 0).sum(axis=1)
            most = int(valid.max())
        else:
            most = k
        if self._state.top_k is not None and most > self._state.top_k:
            r = int(np.argmax(valid)) if has_none else 0
            raise TraceError(
                f"row selects {most} experts but top_k is {self._state.top_k}"
                f" ({self._state.top_k_from})",
                where=where(r),
                hint="pass the model's top_k (`top_k`), or fix the header",
            )
        self._state.max_valid = max(self._state.max_valid, most)
        if mx > self._state.max_expert:
            self._state.max_expert = mx
            if mx >= self._state.num_e:
                self._resize(num_e=mx + 1)
        return has_none

    def _check_width(self, experts: np.ndarray, where: Callable[[int], str]) -> int:
        """``k``, the experts per row: from 1 to ``MAX_TOP_K``, integer ids, the same in
        every row read (the first rows fix it)."""
        if experts.ndim != 2 or experts.shape[1] == 0:
            raise TraceError(
                "routing rows need at least one expert", where=where(0),
                hint="each row lists the top_k experts a token selected in a layer",
            )
        k = int(experts.shape[1])
        if k > constants.MAX_TOP_K:
            raise TraceError(
                f"a row lists {k} experts, more than placer handles ({constants.MAX_TOP_K})",
                where=where(0), hint=_LIMITS_HINT,
            )
        if not np.issubdtype(experts.dtype, np.integer):
            raise TraceError(
                f"expert ids must be integers, got {experts.dtype}", where=where(0),
                hint="store expert ids as int16 or int32",
            )
        if self._state.k is None:
            self._state.k = k
            if self._state.top_k is not None and k < self._state.top_k:
                raise TraceError(
                    f"row has {k} experts but top_k is {self._state.top_k}"
                    f" ({self._state.top_k_from})",
                    where=where(0),
                    hint="each row lists top_k experts (-1 where none)",
                )
            self._resize(num_e=self._state.num_e)
        elif k != self._state.k:
            raise TraceError(
                f"row has {k} experts but earlier rows have {self._state.k}",
                where=where(0),
                hint="all rows must select the same number of experts (top_k); pad with -1",
            )
        return k

    def _check_ids(self, experts: np.ndarray, wf: Callable[[int], str]) -> tuple[int, int]:
        """The smallest and largest expert id, once each id is checked: -1 (none) or an
        expert below ``num_experts`` and ``MAX_EXPERTS``.  ``wf`` names a flat index."""
        mn = int(experts.min())
        if mn < -1:
            i = int(np.argmin(experts.ravel()))
            raise TraceError(
                f"expert id {mn} is negative",
                where=wf(i),
                hint="expert ids are 0..num_experts-1; -1 marks no expert",
            )
        mx = int(experts.max())
        if self._state.num_experts is not None and mx >= self._state.num_experts:
            i = int(np.flatnonzero(experts.ravel() >= self._state.num_experts)[0])
            raise TraceError(
                f"expert id {int(experts.ravel()[i])} is out of range"
                f" [0, {self._state.num_experts})",
                where=wf(i),
                hint=f"num_experts is {self._state.num_experts} ({self._state.experts_from});"
                " check the"
                " model, or pass `num_experts`",
            )
        if mx > constants.MAX_EXPERTS - 1:
            i = int(np.argmax(experts.ravel()))
            raise TraceError(
                f"expert id {mx} is more than placer handles ({constants.MAX_EXPERTS} experts)",
                where=wf(i), hint=_LIMITS_HINT,
            )
        return mn, mx

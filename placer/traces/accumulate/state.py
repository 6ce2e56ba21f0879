"""The bookkeeping every part of an :class:`~placer.traces.accumulate.Accumulator`
shares, in one explicit object (:class:`TraceState`): where the rows come from
(provenance), the declared metadata, the layer rows and the expert capacity, the kind
of input.  The accumulator makes one and hands it to the parts that read or record it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from placer import constants
from placer.errors import TraceError, UsageError
from placer.stats import Provenance
from placer.traces.accumulate.occurrences import WORD_BITS, grown
from placer.traces.chunks import ReadOptions

#: How messages name figures the caller declared (read_routing's arguments, which the
#: CLI fills from --top-k / --num-experts or the model).
DECLARED_EXPERTS = "the declared num_experts"
DECLARED_TOP_K = "the declared top_k"


class TraceState:
    """What the parts of one accumulator share (each part reads and records here, so
    no part reaches into another).

    Attributes
    ----------
    options: what ``read_routing`` was asked for (``coact`` turns off when
        :class:`~placer.traces.accumulate.counting.Counts` leaves co-activation out).
    sources, formats, source, skipped, rows_read, synthetic, model, notes: provenance
        and messages; ``source`` is the file read now.
    num_experts, experts_from, top_k, top_k_from, num_layers_declared: declared
        metadata (None: not declared) and where it came from.
    layer_filter, all_layers: the selected layer ids (``layers``), and every layer id of
        the input, selected or not.
    layer_ids, row_of_layer: row ``r`` of the counts holds absolute layer
        ``layer_ids[r]``; ``row_of_layer[layer id]`` is its row (-1: none yet).
    k, max_valid, num_e, max_expert: width of expert arrays (None: no row yet), most
        valid experts in one row, expert capacity of the counts, largest id read.
    kind: ``"tokens"`` or ``"aggregate"`` (None: nothing read).
    num_tokens: tokens numbered so far.
    pair_tokens, pairs_sampled: tokens whose pairs were counted, and whether some
        token's were not (``options.pair_tokens``).
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.sources: list[str] = []
        self.formats: list[str] = []
        self.source = ""
        self.skipped: Counter[str] = Counter()
        self.rows_read = 0
        self.synthetic = False
        self.model: str | None = None
        self.notes: list[str] = []
        self.num_experts: int | None = options.num_experts
        self.experts_from = DECLARED_EXPERTS if self.num_experts else ""
        self.top_k: int | None = options.top_k
        self.top_k_from = DECLARED_TOP_K if self.top_k else ""
        self.num_layers_declared: int | None = None
        self.layer_filter = (
            None if options.layers is None else np.unique(np.asarray(options.layers))
        )
        self.all_layers: set[int] = set()
        self.layer_ids: list[int] = []
        self.row_of_layer = np.full(0, -1, dtype=np.int64)
        self.k: int | None = None
        self.max_valid = 0
        self.num_e = self.num_experts or 0
        self.max_expert = -1
        self.kind: str | None = None
        self.num_tokens = 0
        self.pair_tokens = 0  # tokens whose pairs were counted (ReadOptions.pair_tokens)
        self.pairs_sampled = False

    def skip(self, reason: str, count: int = 1) -> None:
        """Count ``count`` rows left out on purpose because of ``reason``."""
        if count:
            self.skipped[reason] += count

    def begin_kind(self, kind: str) -> None:
        """Per-token rows and aggregated inputs do not mix."""
        if self.kind is None:
            self.kind = kind
        elif self.kind != kind:
            raise UsageError(
                "per-token traces and aggregated load files cannot be read together",
                where=self.source,
                hint="read them separately",
            )

    def filter_layers(self, layer: np.ndarray) -> np.ndarray | None:
        """Which rows of ``layer`` ids are selected (``layers``), counting the others as
        skipped; None when all are."""
        if self.layer_filter is None:
            return None
        self.all_layers.update(np.unique(layer).tolist())
        keep = np.isin(layer, self.layer_filter)
        if keep.all():
            return None
        self.skip("layer not selected", int((~keep).sum()))
        return keep

    def words(self) -> int:
        """64-bit words of a bit set over the layer rows."""
        return max(1, -(-len(self.layer_ids) // WORD_BITS))

    def rows_of(self, layer: np.ndarray, where: Callable[[int], str]) -> tuple[np.ndarray, bool]:
        """Row of each absolute layer id, adding new layers; and whether some were added
        (the caller grows what is sized by layers)."""
        top = int(layer.max())
        if top >= self.row_of_layer.size:
            self.row_of_layer = grown(self.row_of_layer, (top + 1,), -1)
        rows = self.row_of_layer[layer]
        if not (rows < 0).any():
            return rows, False
        new = np.unique(layer[rows < 0])
        if len(self.layer_ids) + new.size > constants.MAX_LAYERS:
            raise TraceError(
                f"the input names more than {constants.MAX_LAYERS} layers, the most placer"
                " handles", where=where(int(np.flatnonzero(rows < 0)[0])),
                hint="layer is the model's absolute layer index (limits:"
                " docs/limits.md)",
            )
        for lid in new.tolist():
            self.row_of_layer[lid] = len(self.layer_ids)
            self.layer_ids.append(int(lid))
        return self.row_of_layer[layer], True

    def provenance(self) -> Provenance:
        return Provenance(
            sources=tuple(self.sources),
            format="+".join(self.formats),
            rows_read=self.rows_read,
            rows_skipped=tuple(sorted(self.skipped.items())),
            synthetic=self.synthetic,
            model=self.model,
            pair_tokens=self.pair_tokens if self.pairs_sampled and self.options.coact else 0,
            tokens_read=self.num_tokens,
        )

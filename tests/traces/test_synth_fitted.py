"""Tokens fitted to measured statistics (``placer synth --from``): their loads are the
file's, its strongest pairs meet more often than chance, drift moves the load."""

from __future__ import annotations

import numpy as np
import pytest

from placer.errors import DataError
from placer.stats import ExpertStats, PairCounts
from placer.traces import read_routing
from placer.traces.synth.fitted import fit_law, synthesize_from
from placer.traces.synth.write import write_fitted


def _stats() -> ExpertStats:
    """2 layers x 16 experts, top-2; in layer 0 experts 3 and 9 meet far above chance."""
    rng = np.random.default_rng(0)
    load = np.stack([rng.integers(50, 400, 16), np.linspace(500, 20, 16).astype(np.int64)])
    coact = np.zeros((2, 16, 16), dtype=np.int64)
    coact[0, 3, 9] = coact[0, 9, 3] = min(load[0, 3], load[0, 9]) // 2
    return ExpertStats(load=load[None], tokens=np.array([load[0].sum() // 2]),
                       layer_ids=np.array([4, 5]), top_k=2,
                       coact=PairCounts.from_dense(coact, symmetric=True))


def _generated(law, tokens: int, **kw) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate([c.topk_ids for c in synthesize_from(
        law, num_tokens=tokens, tokens_per_step=256, seed=2, **kw)])
    load = np.stack([np.bincount(ids[:, r].ravel(), minlength=16) for r in range(2)])
    return ids, load


def test_loads_match_the_file_and_the_strong_pair_meets_above_chance() -> None:
    stats = _stats()
    law = fit_law(stats)
    assert law.fit_error() < 0.01
    ids, load = _generated(law, 20000)
    share = load / load.sum(axis=1, keepdims=True)
    target = stats.load[0] / stats.load[0].sum(axis=1, keepdims=True)
    assert np.abs(share - target).max() < 0.015
    assert (np.sort(ids, axis=2)[:, :, 0] != np.sort(ids, axis=2)[:, :, 1]).all()  # distinct
    layer0 = ids[:, 0]
    both = int(((layer0 == 3).any(axis=1) & (layer0 == 9).any(axis=1)).sum())
    tokens = layer0.shape[0]
    lift = both * tokens / (load[0, 3] * load[0, 9])
    assert lift > 1.5


def test_drift_moves_the_load_between_the_first_and_last_steps() -> None:
    law = fit_law(_stats())
    ids, _ = _generated(law, 256 * 64, drift=0.25)
    first = np.bincount(ids[:2048, 1].ravel(), minlength=16)
    last = np.bincount(ids[-2048:, 1].ravel(), minlength=16)
    tv = 0.5 * np.abs(first / first.sum() - last / last.sum()).sum()
    assert tv > 0.1


def test_a_layer_without_load_is_refused() -> None:
    stats = _stats()
    empty = stats.load.copy()
    empty[0, 1] = 0
    with pytest.raises(DataError, match="layer 5 has no load"):
        fit_law(ExpertStats(load=empty, tokens=stats.tokens, layer_ids=stats.layer_ids, top_k=2))


def test_written_trace_reads_back_with_its_source_in_the_header(tmp_path) -> None:
    law = fit_law(_stats())
    out = tmp_path / "fitted.npz"
    result = write_fitted(out, law, source="measured.npz", model=None, num_tokens=1000,
                          tokens_per_step=100, num_ranks=4)
    assert result["fit_error"] < 0.01 and result["tokens"] == 1000
    with pytest.warns(UserWarning, match="declares itself synthetic"):
        data = read_routing(out, keep_tokens=True)
    assert data.trace is not None and data.trace.topk_ids.shape == (1000, 2, 2)
    assert data.stats.load.sum() == 1000 * 2 * 2
    assert data.stats.provenance.synthetic

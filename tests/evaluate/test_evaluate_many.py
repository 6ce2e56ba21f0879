"""evaluate_many: several placements on the same parts, the same figures as one by one."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from evaluate_fixtures import cluster, placement, routing_of, tiny_model

from placer.errors import PlacerError
from placer.evaluate import EvalParams, evaluate, evaluate_many


def _routing(windows: int = 4):
    rng = np.random.default_rng(3)
    keys = rng.gumbel(size=(256, 2, 4)) + np.log(np.linspace(3, 1, 4))
    ids = np.argsort(-keys, axis=2)[:, :, :2].astype(np.int32)
    step = np.arange(256, dtype=np.int64) // 16
    return routing_of(ids, np.array([0, 1]), step, np.full(256, -1), 4, windows=windows)


def test_each_part_each_placement_equal_to_one_evaluation():
    routing, topo, model = _routing(), cluster((2,)), tiny_model()
    plans = [("a", placement([[0, 1, 2, 3]] * 2, 2)), ("b", placement([[0, 2, 1, 3]] * 2, 2))]
    seen = []
    parts = evaluate_many(plans, routing, topo, model, EvalParams(seed=1),
                          on_start=lambda label, part, w: seen.append((label, part, w)))
    assert [(p.name, p.windows) for p in parts] == [("fit", (0, 3)), ("held-out", (3, 4))]
    assert seen == [("a", "fit", (0, 3)), ("b", "fit", (0, 3)),
                    ("a", "held-out", (3, 4)), ("b", "held-out", (3, 4))]
    for part in parts:
        assert [label for label, _ in part.evaluations] == ["a", "b"]
        for (label, got), (_, plan) in zip(part.evaluations, plans, strict=True):
            alone = evaluate(plan, routing, topo, model, EvalParams(seed=1, windows=part.windows))
            assert got.metrics == alone.metrics, label
        assert part.source == part.evaluations[0][1].source


def test_explicit_parts_and_errors_name_the_placement():
    routing, topo, model = _routing(), cluster((2,)), tiny_model()
    good = placement([[0, 1, 2, 3]] * 2, 2)
    parts = evaluate_many([("a", good)], routing, topo, model, EvalParams(),
                          fit=(0, 2), held_out=(2, None))
    assert [(p.name, p.windows) for p in parts] == [("fit", (0, 2)), ("held-out", (2, 4))]
    wrong = placement([[0, 1, 2, 3, 0, 1]] * 2, 3)  # 3 GPUs on a 2-GPU cluster
    with pytest.raises(PlacerError) as info:
        evaluate_many([("mine", wrong)], routing, topo, model, EvalParams())
    assert info.value.where == "mine"


def test_a_repeated_warning_is_said_once(monkeypatch):
    import placer.evaluate.many as many

    routing, topo, model = _routing(), cluster((2,)), tiny_model()

    def noisy(*args, **kwargs):
        warnings.warn("the same finding", UserWarning, stacklevel=2)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(many, "evaluate", noisy)
    plans = [(name, placement([[0, 1, 2, 3]] * 2, 2)) for name in ("a", "b", "c")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate_many(plans, routing, topo, model, EvalParams())
    assert [str(w.message) for w in caught] == ["the same finding"]  # 6 evaluations, 1 line

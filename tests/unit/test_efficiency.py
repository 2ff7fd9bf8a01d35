"""FedKD-NAS efficiency scores: the paper's published figures and the formulas' edge cases."""

from __future__ import annotations

import pytest

from fedapp.evaluation.efficiency import MethodCosts, ces, efficiency_scores, pqs, res, ues


def test_the_papers_cifar10_mobilenetv2_iid_row() -> None:
    assert ues(0.6940, 44.49, 0.7625) == pytest.approx(40.49, abs=0.005)
    assert ues(0.6940, 44.49, None) == pytest.approx(0.6940 * 44.49)


def test_pqs_ces_res_on_hand_checkable_methods() -> None:
    # accuracy spread 0.8..0.9, loss spread 0.3..0.7
    assert pqs(0.9, 0.3, [0.8, 0.9], [0.3, 0.7]) == pytest.approx(1.0)
    assert pqs(0.8, 0.7, [0.8, 0.9], [0.3, 0.7]) == pytest.approx(0.0)
    assert pqs(0.85, 0.5, [0.8, 0.9], [0.3, 0.7]) == pytest.approx(0.7 * 0.5 + 0.3 * 0.5)
    assert ces(2.0, [2.0, 100.0]) == pytest.approx(50.0)
    assert res(50.0, 100.0, [100.0, 50.0], [200.0, 100.0]) == pytest.approx(0.5)


def test_scores_across_a_comparison() -> None:
    scores = efficiency_scores(
        {
            "logits": MethodCosts(0.90, 0.30, comm_mb=1.0, cpu_percent=80.0, memory_mb=300.0),
            "weights": MethodCosts(0.80, 0.70, comm_mb=40.0, cpu_percent=100.0, memory_mb=400.0),
        }
    )
    assert scores["logits"]["PQS"] == pytest.approx(1.0)
    assert scores["logits"]["CES"] == pytest.approx(40.0)
    assert scores["logits"]["RES"] == pytest.approx(0.5 * 0.8 + 0.5 * 0.75)
    assert scores["logits"]["UES"] == pytest.approx(40.0 / 0.775)
    assert scores["weights"]["UES*"] == pytest.approx(0.0)


def test_without_a_resource_trace_only_ues_star_is_given() -> None:
    scores = efficiency_scores(
        {"a": MethodCosts(0.9, 0.3, comm_mb=1.0), "b": MethodCosts(0.8, 0.4, comm_mb=2.0)}
    )
    assert scores["a"]["RES"] is None and scores["a"]["UES"] is None
    assert scores["a"]["UES*"] == pytest.approx(2.0)

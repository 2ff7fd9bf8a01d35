"""`fedapp profile`: the reference measurement and the budget rule, on this CPU, briefly."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from fedapp.tools.cli import main
from fedapp.tools.device_speed import add_arguments, measure, profile, propose_budget


def test_measurement_counts_real_training_steps() -> None:
    result = measure(seconds=0.3, batch_size=8)
    assert result.device == "cpu" and result.batch_size == 8
    assert result.steps >= 1 and result.seconds > 0
    # cnn-small on 1x28x28: the two 32-channel convs alone are 28*28*32*9*(1+32) MACs
    assert result.forward_macs_per_example > 28 * 28 * 32 * 9 * 33
    assert math.isfinite(result.macs_per_second) and result.macs_per_second > 0


def test_budget_is_linear_hence_monotone_in_measured_speed() -> None:
    rates = [1e9, 5e9, 2.5e10, 1e11]
    budgets = [propose_budget(rate, step_seconds=0.5, batch_size=32) for rate in rates]
    assert budgets == sorted(budgets) and len(set(budgets)) == len(budgets)
    # a step of the proposed model at batch 32 costs 3 * budget * 32 MACs = rate * 0.5 s
    assert budgets[0] * 3 * 32 == pytest.approx(1e9 * 0.5)
    assert propose_budget(2e9, 1.0, 32) == pytest.approx(2 * propose_budget(1e9, 1.0, 32))
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            propose_budget(bad, 0.5, 32)


def test_profile_command_reports_a_usable_node_config(capsys) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    data, text = profile(parser.parse_args(["--seconds", "0.2", "--batch-size", "4"]))
    assert data["budget"] > 0 and data["node_config"] == f"budget={data['budget']}"
    assert data["workload"]["steps"] >= 1 and data["macs_per_second"] > 0
    assert data["budget"] == round(propose_budget(data["macs_per_second"], 0.5, 4))
    assert f"budget={data['budget']}" in text

    assert main(["profile", "--seconds", "0.2", "--batch-size", "4", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == set(data)

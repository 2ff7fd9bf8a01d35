"""Run configs several test modules share: small runs on scikit-learn's real 8x8 digits, as
python_name overrides for ``local_grid.run_config``."""

from __future__ import annotations

from typing import Any

#: FEAST on the small digits cache (nine variants, 0.20M to 4.20M MACs), budgets spanning them.
DIGITS_FEAST: dict[str, Any] = {
    "strategy": "feast",
    "dataset": "digits",
    "feast_space__variant_cache": "feast-small-digits",
    "budget_min": 2e5,
    "budget_max": 6e6,
    "allocation_cap": 4.2e6,
    "validation_size": 200,
    "test_size": 300,
    "calibration_size": 50,
    "batch_size": 16,
    "partitioner": "budget-dirichlet",
}

#: Over the fedavg-digits preset: four clients, three a round, one local epoch (a few seconds a
#: round).
SMALL_FEDAVG: dict[str, Any] = {"num_clients": 4, "fraction_train": 0.75, "local_epochs": 1}

#: FedKD-NAS's LeNet5 family on digits, three clients (budgets 82,918 / 10,000 / 300,000 MACs
#: with seed 42: x0.25 7,720, x0.5 19,260, x1.0 66,600, x2.0 245,520 MACs), all in every round.
DIGITS_FEDKD_NAS: dict[str, Any] = {
    "dataset": "digits",
    "candidates__family": "lenet5",
    "partitioner": "iid",
    "budget_min": 1e4,
    "budget_max": 3e5,
    "num_clients": 3,
    "fraction_train": 1.0,
    "local_epochs": 4,
    "batch_size": 16,
    "learning_rate": 0.02,
    "lr_schedule": "constant",
    "calibration_size": 0,
    "validation_size": 200,
    "public_size": 200,
    "test_size": 300,
    "fedkd_nas__teacher_epochs": 20,
    "eval_every": 1,
}

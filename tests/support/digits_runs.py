"""Run configs several test modules share: small runs on scikit-learn's real 8x8 digits, as
python_name overrides for ``local_grid.run_config``."""

from __future__ import annotations

from typing import Any

#: FEAST on the small digits cache (nine variants, 0.20M to 4.20M MACs), budgets spanning them.
DIGITS_FEAST: dict[str, Any] = {
    "strategy": "feast",
    "dataset": "digits",
    "variant_cache": "feast-small-digits",
    "budget_min": 2e5,
    "budget_max": 6e6,
    "allocation_cap": 4.2e6,
    "validation_size": 200,
    "test_size": 300,
    "calibration_size": 50,
    "batch_size": 16,
    "partitioner": "budget-dirichlet",
}

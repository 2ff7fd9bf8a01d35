"""``fedapp budgets``: a run config's budget population and its routed traffic, without training.

What a FEAST run would see before its first round: every client's budget (the Zipf draw of the
run config, by its ``budget-rng``), how many variants each co-trains per mini-batch (1, 2 or 3
passes), and the routed payloads. Communication is reported two ways with the keys of
summary.json's ``comm``:

- ``comm``: each client of the population once, as the FEAST authors' script
  (``reproduce_sub_supernet_communication_reduction.py``) computes the paper's Tab. 2: mean
  routed parameters over the N clients, the full supernet over that mean, and per-client P/P_i;
- ``comm_cohorts``: over every round's cohort draw (by the run config's ``cohort-rng``), which is
  what a run's summary.json reports (its per-client figures are over the population as well).

The cache is counted on the supernet YAML's own input size and classes (the data set is not
loaded), which for the shipped presets are their data sets'.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedapp.evaluation.accounting import CommunicationLedger
from fedapp.methods.feast.settings import FeastSettings
from fedapp.models.arch import load_supernet
from fedapp.models.cache import load_cache
from fedapp.models.counter import count
from fedapp.partitions.cohorts import cohort_indices
from fedapp.run.config import APP_DIR, ConfigError, RunConfig, fused_run_config, parse_run_config
from fedapp.run.context import piece
from fedapp.run.feast_space import ModelSpace
from fedapp.run.federated_data import client_budgets
from fedapp.run.pieces import BudgetDraw, FeastSpaceSection
from fedapp.training.co_training import plan_for

#: The ``comm`` keys reported (those of summary.json's ``comm`` that need no bytes).
COMM_KEYS = (
    "mean_params_per_client_round",
    "aggregate_reduction",
    "client_reduction_mean",
    "client_reduction_median",
    "client_reduction_max",
)


def load_run_config(path: str | Path) -> RunConfig:
    """A preset TOML over the defaults of pyproject.toml, validated like a run's."""
    import tomllib

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no run config file {str(path)!r}")
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not TOML ({err})") from None
    return parse_run_config(fused_run_config(APP_DIR, values))


@dataclass(frozen=True)
class BudgetPlan:
    """The population of one run config and what routing sends it."""

    budgets: np.ndarray
    passes: list[int]
    params: list[int]  # routed parameters P_i by partition id
    full_params: int
    cohorts: list[np.ndarray]  # partition ids per round
    affordable: list[int]  # number of affordable variants by partition id

    def comm(self, cohorts: bool) -> dict[str, float]:
        """Communication figures over the population once, or over every round's cohort."""
        ledger = CommunicationLedger(self.full_params)
        rounds = self.cohorts if cohorts else [np.arange(len(self.params))]
        for r, chosen in enumerate(rounds, start=1):
            for pid in chosen:
                ledger.add(r, int(pid), self.params[pid], 0, 0)
        summary = ledger.summary(dict(enumerate(self.params)))
        return {key: summary[key] for key in COMM_KEYS}


def budget_plan(cfg: RunConfig) -> BudgetPlan:
    """Budgets, passes, routed payloads and cohorts of ``cfg`` (FEAST routing, as configured)."""
    keys = cfg.section(FeastSpaceSection)
    config = load_supernet(keys.supernet)
    cache = load_cache(keys.variant_cache, config=config)
    space = ModelSpace(config, cache, count(config, config.max_arch()).params)
    budgets = client_budgets(piece(BudgetDraw, cfg))
    if budgets.min() < cache.min_macs:
        raise ConfigError(
            f"run config 'budget-min' = {cfg.budget_min:,.0f} MACs (with 'budget-floor' = "
            f"{cfg.budget_floor:,.0f}) lets budgets fall below the smallest variant of cache "
            f"'{keys.variant_cache}' ({cache.min_macs:,} MACs)"
        )
    routes = [space.route(float(b)) for b in budgets]
    passes = [
        plan_for(space.cache, r.affordable, cfg.section(FeastSettings).training_rule).num_passes
        for r in routes
    ]
    routing = cfg.section(FeastSettings).routing
    params = [r.params if routing else space.full_params for r in routes]
    n = len(budgets)
    cohorts = [
        cohort_indices(cfg.cohort_rng, cfg.seed, rnd, n, min(cfg.cohort_size, n))
        for rnd in range(1, cfg.num_server_rounds + 1)
    ]
    affordable = [len(r.affordable) for r in routes]
    return BudgetPlan(budgets, passes, params, space.full_params, cohorts, affordable)


def report(cfg: RunConfig, below: list[float]) -> dict[str, Any]:
    """The JSON of ``fedapp budgets``."""
    plan = budget_plan(cfg)
    by_passes = Counter(plan.passes)
    keys = cfg.section(FeastSpaceSection)
    return {
        "supernet": keys.supernet,
        "variant_cache": keys.variant_cache,
        "budget_rng": cfg.budget_rng,
        "cohort_rng": cfg.cohort_rng,
        "budgets": [float(b) for b in plan.budgets],
        "clients_below": {str(round(b)): int((plan.budgets < b).sum()) for b in below},
        "clients_only_smallest_variant": plan.affordable.count(1),
        "passes": {str(k): by_passes.get(k, 0) for k in (1, 2, 3)},
        "full_params": plan.full_params,
        "comm": plan.comm(cohorts=False),
        "comm_cohorts": plan.comm(cohorts=True),
        "rounds": cfg.num_server_rounds,
        "cohort_size": cfg.cohort_size,
    }


def render(data: dict[str, Any]) -> str:
    """The text of ``fedapp budgets``."""

    def comm_line(name: str, comm: dict[str, float]) -> str:
        return (
            f"{name:<14} {comm['mean_params_per_client_round'] / 1e6:.2f}M params per client, "
            f"aggregate {comm['aggregate_reduction']:.1f}x, per client mean "
            f"{comm['client_reduction_mean']:.1f}x / median {comm['client_reduction_median']:.1f}x"
            f" / max {comm['client_reduction_max']:.0f}x"
        )

    budgets = np.array(data["budgets"])
    below = ", ".join(f"{n} below {float(b) / 1e6:g}M" for b, n in data["clients_below"].items())
    return "\n".join(
        [
            f"budgets        {len(budgets)} clients ({data['budget_rng']} draw), "
            f"{budgets.min():,.0f} - {budgets.max():,.0f} MACs, median {np.median(budgets):,.0f}",
            f"clients        {data['clients_only_smallest_variant']} afford only the smallest "
            f"variant; {below}",
            f"passes         {data['passes']} (clients by variants co-trained per mini-batch)",
            comm_line("population", data["comm"]),
            comm_line(f"{data['rounds']} cohorts", data["comm_cohorts"])
            + f" ({data['cohort_size']} clients a round, {data['cohort_rng']} draw)",
        ]
    )

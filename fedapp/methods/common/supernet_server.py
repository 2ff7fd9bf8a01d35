"""Base of the methods that train the FEAST model space: one supernet and its variant cache.

FEAST and its transferred predecessors (SuperFedNAS, DeepFedNAS) differ in what a client trains
and how replies merge, but must be measured alike: the same seeded supernet at round 0, the same
eligibility rule, validation on the same anchor variants, and a final report where every cached
variant gets its own BN recalibration and each client is served its largest affordable variant.
That shared part lives here so the comparison between them is like for like.
"""

from __future__ import annotations

from abc import abstractmethod
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.intervals import format_accuracy, format_row
from fedapp.evaluation.operating_points import (
    OperatingPoint,
    operating_point_report,
    points_validation,
    variant_points,
)
from fedapp.methods.common.evaluators import OperatingPoints
from fedapp.methods.common.strategy import HeterogeneousStrategy, State, point_evaluator
from fedapp.models.budgets import BudgetError
from fedapp.models.elastic_resnet import ElasticResNet
from fedapp.models.routing import Route
from fedapp.random_streams import Stream, stream_seed
from fedapp.run.context import RunContext
from fedapp.run.feast_space import model_space
from fedapp.run.profiles import NodeProfile, NodeRegistry


class CachedSupernetStrategy(HeterogeneousStrategy):
    """Model space, eligibility, per-variant evaluation and report shared by FEAST-space methods."""

    #: Name used in log lines and report titles.
    method = "FEAST"

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.space = model_space(self.run.feast_space, self.info)
        self.anchors = self.space.anchors(run.feast_space.anchor_variants)
        self.points = point_evaluator(self.run)
        self.evaluator = OperatingPoints(self.validate, self.test_report)

    # ---- budgets ------------------------------------------------------------------------------
    def route_of(self, profile: NodeProfile) -> Route:
        """A node's affordable cached variants and their routed envelope."""
        return self.space.route(profile.budget)

    def ineligibility(self, profile: NodeProfile) -> str | None:
        """A node whose budget affords no cached variant cannot take part."""
        try:
            self.route_of(profile)
        except BudgetError as err:
            return str(err)
        return None

    def eligible_routes(self) -> dict[int, Route]:
        """Partition id -> route of every profiled node that can take part."""
        return {
            p.partition_id: self.route_of(p)
            for p in self.nodes.profiles.values()
            if self.eligible(p)
        }

    # ---- global state -------------------------------------------------------------------------
    def initial_state(self) -> State:
        model = ElasticResNet(
            self.space.config, seed=stream_seed(self.run.rounds.seed, Stream.INITIAL_WEIGHTS)
        )
        return {k: v.numpy().copy() for k, v in model.state_dict().items()}

    def reference_params(self, global_state: State) -> int:
        return self.space.full_params

    # ---- evaluation ---------------------------------------------------------------------------
    def variant_rows(self, state: State, indices: list[int], data: ImageArrays) -> list[dict]:
        """Accuracy and loss of cached variants, each after its own BN recalibration."""
        return self.points.variants(self.space.config, self.space.cache, state, indices, data)

    def servable_points(self, state: State) -> list[OperatingPoint]:
        """Every cached variant (the final test's points)."""
        indices = range(len(self.space.cache))
        return variant_points(self.space.config, self.space.cache, state, indices)

    def validate(self, state: State, data: ImageArrays) -> dict[str, float]:
        rows = self.variant_rows(state, self.anchors, data)
        return points_validation(rows, lambda r: f"val-acc-v{r['index']}")

    @abstractmethod
    def test_report(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        """The final test: :meth:`served_report` and what the method adds to it."""

    def served_report(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        """Every cached variant tested, population accuracy under largest-affordable serving."""
        variants = self.points.rows(self.servable_points(state), data)
        routes = self.eligible_routes()
        return operating_point_report(
            run_dir,
            f"{self.method} on {self.run.data.source.dataset}",
            variants,
            served={pid: r.largest for pid, r in routes.items()},
            budgets={pid: r.budget for pid, r in routes.items()},
            trained=self.accounting.trained_points,
        )

    def log_report(self, summary: dict[str, Any], comm: dict[str, float]) -> None:
        """The operating points, population accuracy and communication, one line each."""
        log(
            INFO,
            "%s operating points (test accuracy after per-variant BN recalibration):",
            self.method,
        )
        for v in summary["variants"]:
            nominal = v["nominal_macs"]
            log(
                INFO,
                "\tvariant %2d | %8.2fM MACs%s | %7.3fM params | %s%s",
                v["index"],
                v["macs"] / 1e6,
                f" (nominal {nominal / 1e6:.2f}M)" if nominal != v["macs"] else "",
                v["params"] / 1e6,
                format_row(v),
                "" if v["trained"] else " (no client trained it)",
            )

        log(
            INFO,
            "population accuracy: %s (largest affordable variant), %.2f%% (most accurate "
            "affordable variant)",
            format_accuracy(summary["population_accuracy"], summary["population_accuracy_ci95"]),
            100 * summary["population_accuracy_best_affordable"],
        )
        log(
            INFO,
            "communication: %.3fM params per client-round, aggregate reduction %.1fx, "
            "per client mean %.1fx / median %.1fx / max %.1fx",
            comm.get("mean_params_per_client_round", 0.0) / 1e6,
            comm.get("aggregate_reduction", 0.0),
            comm["client_reduction_mean"],
            comm["client_reduction_median"],
            comm["client_reduction_max"],
        )

"""FEAST (federated shared-space training), the server side of the paper's Algorithm 1.

Each sampled client gets the leading slices of its routed envelope (the smallest sub-supernet that
holds every cached variant it can afford) plus its affordable list; replies are merged by sparse
sample-weighted averaging. Validation recalibrates BN per anchor variant; the final report gives
every cached variant its own recalibration and one test evaluation, population accuracy under
largest-affordable serving, and the communication, compute and exposure accounting.
"""

from __future__ import annotations

from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedapp.clients.feast import plan_for
from fedapp.clients.training import resolve_device
from fedapp.config import RunConfig
from fedapp.data.registry import ImageArrays
from fedapp.evaluation.accounting import exposure
from fedapp.evaluation.operating_points import evaluate_variants, operating_point_report
from fedapp.feast_space import model_space
from fedapp.federated_data import population, server_set
from fedapp.models.elastic_resnet import ElasticResNet, state_shapes
from fedapp.models.routing import BudgetError, Route
from fedapp.models.slicing import SliceAccumulator, extract
from fedapp.profiles import NodeProfile, NodeRegistry
from fedapp.strategies.base import SELECTION_KEY, HeterogeneousStrategy, State
from fedapp.strategies.replies import ValidReply


class FeastStrategy(HeterogeneousStrategy):
    """Routed payloads, sparse aggregation, per-variant evaluation and accounting."""

    def __init__(self, cfg: RunConfig, nodes: NodeRegistry) -> None:
        super().__init__(cfg, nodes)
        self.info = population(cfg).info
        self.space = model_space(cfg, self.info)
        self.anchors = self.space.anchors(cfg.anchor_variants)
        self.device = resolve_device(cfg.device)
        self.calibration = server_set(cfg, "calibration")
        self._refused: set[int] = set()

    # ---- routing -------------------------------------------------------------------------------
    def route_of(self, profile: NodeProfile) -> Route:
        return self.space.route(profile.budget)

    def eligible(self, profile: NodeProfile) -> bool:
        """A node whose budget affords no cached variant is left out, with a logged reason."""
        try:
            self.route_of(profile)
        except BudgetError as err:
            if profile.node_id not in self._refused:
                self._refused.add(profile.node_id)
                log(
                    ERROR,
                    "FEAST: node %s (partition %d) left out: %s",
                    profile.node_id,
                    profile.partition_id,
                    err,
                )
            return False
        return True

    # ---- one round ------------------------------------------------------------------------------
    def initial_state(self) -> State:
        model = ElasticResNet(self.space.config, seed=self.cfg.seed)
        return {k: v.numpy().copy() for k, v in model.state_dict().items()}

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        if self.cfg.routing:
            return extract(global_state, self.route_of(profile).shapes)
        return global_state

    def reference_params(self, global_state: State) -> int:
        return self.space.full_params

    def payload_params(self, profile: NodeProfile, payload: State) -> int:
        return self.route_of(profile).params if self.cfg.routing else self.space.full_params

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        return super().train_config(server_round, profile) | {
            "affordable": list(self.route_of(profile).affordable),
            "routed": self.cfg.routing,
        }

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        accumulator = SliceAccumulator(global_state)
        for reply in replies:
            accumulator.add(reply.arrays, weight=reply.num_examples)
        return accumulator.result()

    # ---- evaluation ---------------------------------------------------------------------------
    def _variants(self, state: State, indices: list[int], data: ImageArrays) -> list[dict]:
        return evaluate_variants(
            self.space,
            state,
            indices,
            calibration=self.calibration,
            data=data,
            info=self.info,
            batch_size=self.cfg.batch_size,
            device=self.device,
            seed=self.cfg.seed,
        )

    def evaluate(self, state: State, data: ImageArrays) -> dict[str, float]:
        """The largest cached variant (what a single-model method would serve)."""
        row = self._variants(state, [len(self.space.cache) - 1], data)[0]
        return {"loss": row["loss"], "accuracy": row["accuracy"], "examples": len(data.labels)}

    def validation_metrics(self, state: State, data: ImageArrays) -> dict[str, float]:
        rows = self._variants(state, self.anchors, data)
        metrics = {f"val-acc-v{r['index']}": r["accuracy"] for r in rows}
        metrics["val-loss"] = float(np.mean([r["loss"] for r in rows]))
        metrics[SELECTION_KEY] = float(np.mean([r["accuracy"] for r in rows]))
        return metrics

    def test_summary(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        variants = self._variants(state, list(range(len(self.space.cache))), data)
        profiles = [p for p in self.nodes.profiles.values() if self.eligible(p)]
        routes = {p.partition_id: self.route_of(p) for p in profiles}
        report = operating_point_report(
            run_dir,
            f"FEAST on {self.cfg.dataset}",
            variants,
            served={pid: r.largest for pid, r in routes.items()},
            budgets={p.partition_id: p.budget for p in profiles},
        )
        passes = [
            plan_for(self.space, r.affordable, self.cfg.training_rule).num_passes
            for r in routes.values()
        ]
        global_shapes = state_shapes(self.space.config, self.space.config.max_arch())
        routed_shapes = [r.shapes if self.cfg.routing else global_shapes for r in routes.values()]
        params_by_client = {
            pid: (r.params if self.cfg.routing else self.space.full_params)
            for pid, r in routes.items()
        }
        summary = (
            report
            | self.accounting_summary(run_dir, params_by_client)
            | {
                "clients_by_passes": {str(n): passes.count(n) for n in (1, 2, 3)},
                "exposure": exposure(global_shapes, routed_shapes, self.cfg.cohort_size),
            }
        )
        self._log_report(summary)
        return summary

    def _log_report(self, summary: dict[str, Any]) -> None:
        log(INFO, "FEAST operating points (test accuracy after per-variant BN recalibration):")
        for v in summary["variants"]:
            log(
                INFO,
                "\tvariant %2d | %8.2fM MACs | %7.3fM params | %.2f%%",
                v["index"],
                v["macs"] / 1e6,
                v["params"] / 1e6,
                100 * v["accuracy"],
            )
        comm = summary["comm"]
        log(
            INFO,
            "population accuracy (largest affordable variant): %.2f%%",
            100 * summary["population_accuracy"],
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
        log(
            INFO,
            "training compute proxy: %.3f TMACs; clients by passes %s; exposure R_min %d "
            "(coverage %.4f per round)",
            summary["compute_proxy_total_macs"] / 1e12,
            summary["clients_by_passes"],
            summary["exposure"]["r_min"],
            summary["exposure"]["min_coverage"],
        )

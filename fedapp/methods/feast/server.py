"""FEAST (federated shared-space training), the server side of the paper's Algorithm 1.

Each sampled client gets the leading slices of its routed envelope (the smallest sub-supernet that
holds every cached variant it can afford) plus its affordable list; replies are merged by sparse
sample-weighted averaging. Validation recalibrates BN per anchor variant; the final report gives
every cached variant its own recalibration and one test evaluation, population accuracy under
largest-affordable serving, and the communication, compute and exposure accounting.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.accounting import exposure
from fedapp.methods.common.aggregation import slice_mean
from fedapp.methods.common.reply_validation import ComputeFloor, ValidReply
from fedapp.methods.common.strategy import State
from fedapp.methods.common.supernet_server import CachedSupernetStrategy
from fedapp.methods.feast.keys import AFFORDABLE, ROUTED
from fedapp.methods.feast.settings import FeastSettings
from fedapp.models.elastic_resnet import state_shapes
from fedapp.models.slicing import extract
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.training.co_training import CoTrainingPlan, plan_for


class FeastStrategy(CachedSupernetStrategy):
    """Routed payloads, sparse aggregation, per-variant evaluation and accounting."""

    method = "FEAST"

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.settings = run.section(FeastSettings)

    # ---- one round ------------------------------------------------------------------------------
    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        if self.settings.routing:
            return extract(global_state, self.route_of(profile).shapes)
        return global_state

    def payload_params(self, profile: NodeProfile, payload: State) -> int:
        return self.route_of(profile).params if self.settings.routing else self.space.full_params

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        return super().train_config(server_round, profile) | {
            AFFORDABLE: list(self.route_of(profile).affordable),
            ROUTED: self.settings.routing,
        }

    def plan_of(self, profile: NodeProfile) -> CoTrainingPlan:
        """The co-training plan the node's client follows (from the affordable set it is sent)."""
        return plan_for(
            self.space.cache, self.route_of(profile).affordable, self.settings.training_rule
        )

    def points_trained(self, profile: NodeProfile) -> list[int]:
        """The cached variants of the node's plan: the minimum, its maximum, (rule full) the
        intermediates it draws from."""
        return [self.space.cache.variants.index(v) for v in self.plan_of(profile).trained]

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """Local epochs of the node's plan, its random pass at the cheapest intermediate."""
        return self.training_floor(self.plan_of(profile).least_forward_macs)

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        return slice_mean(global_state, replies)

    # ---- evaluation ---------------------------------------------------------------------------
    def params_by_client(self, state: State) -> dict[int, int]:
        """A client's routed slice (the whole supernet without routing)."""
        return {
            pid: (r.params if self.settings.routing else self.space.full_params)
            for pid, r in self.eligible_routes().items()
        }

    def test_report(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        routes = self.eligible_routes()
        passes = [
            plan_for(self.space.cache, r.affordable, self.settings.training_rule).num_passes
            for r in routes.values()
        ]
        global_shapes = state_shapes(self.space.config, self.space.config.max_arch())
        routed_shapes = [
            r.shapes if self.settings.routing else global_shapes for r in routes.values()
        ]
        summary = self.served_report(state, data, run_dir) | {
            "clients_by_passes": {str(n): passes.count(n) for n in (1, 2, 3)},
            "exposure": exposure(global_shapes, routed_shapes, self.run.rounds.cohort_size),
        }
        self.log_report(summary, self.communication(state))
        log(
            INFO,
            "training compute proxy: %.3f TMACs; clients by passes %s; exposure R_min %d "
            "(coverage %.4f per round)",
            self.accounting.compute_total() / 1e12,
            summary["clients_by_passes"],
            summary["exposure"]["r_min"],
            summary["exposure"]["min_coverage"],
        )
        return summary

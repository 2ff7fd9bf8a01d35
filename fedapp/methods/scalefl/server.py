"""ScaleFL (Ilhan, Su, Liu, CVPR 2023) on the ResNet18 substrate: depth-width levels with exits.

Each sampled client trains the largest of the four levels whose MACs (backbone and every exit)
fit its budget; a client below the smallest level trains that one anyway (the FEAST paper's
minimum-tier fallback), and such clients are counted and reported. The server sends a level's
leading slices and averages each position over the clients whose level holds it, every client
counting once (the reference ``average_weights`` is unweighted by sample count); positions no
client held keep their value, so deeper blocks and exit heads are averaged only over the clients
that reach them. The operating points are the levels' deepest exits, each with its own BN
recalibration; population accuracy serves each client its largest affordable level.
"""

from __future__ import annotations

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
)
from fedapp.methods.common.aggregation import slice_mean
from fedapp.methods.common.evaluators import OperatingPoints
from fedapp.methods.common.reply_validation import ComputeFloor, ValidReply
from fedapp.methods.common.strategy import HeterogeneousStrategy, State, point_evaluator
from fedapp.methods.scalefl.keys import LEVEL
from fedapp.methods.scalefl.settings import ScaleFLSettings
from fedapp.models.early_exits import (
    SCALEFL_LEVELS,
    EarlyExitResNet,
    affordable_level,
    level_costs,
    level_model,
    level_shapes,
)
from fedapp.models.slicing import extract
from fedapp.random_streams import Stream, stream_seed
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.run.run_models import substrate_config
from fedapp.wire.records import load_state


class ScaleFLStrategy(HeterogeneousStrategy):
    """Level payloads, count-averaged slices, per-level evaluation and the fallback count."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.settings = run.section(ScaleFLSettings)
        self.substrate = substrate_config(self.run.substrate, self.info)
        self.costs = level_costs(self.substrate, self.settings.exit_convs)
        self.points = point_evaluator(self.run)
        self.evaluator = OperatingPoints(self.validate, self.test_report)
        below = self.clients_below_smallest_level()
        log(
            INFO,
            "ScaleFL: levels (blocks, width) %s cost %s MACs; clients_below_smallest_level = %d "
            "of %d (they train level 1 anyway)",
            [(lv.blocks, lv.width) for lv in SCALEFL_LEVELS],
            [f"{c.macs / 1e6:.2f}M" for c in self.costs],
            below,
            len(nodes.profiles),
        )

    # ---- levels ---------------------------------------------------------------------------------
    def level_of(self, profile: NodeProfile) -> int:
        """The largest affordable level (the smallest for clients that afford none)."""
        return affordable_level(self.costs, profile.budget)[0]

    def clients_below_smallest_level(self) -> int:
        """Profiled clients whose budget is below the smallest level's MACs."""
        return sum(affordable_level(self.costs, p.budget)[1] for p in self.nodes.profiles.values())

    def _shapes(self, level: int) -> dict[str, tuple[int, ...]]:
        return level_shapes(self.substrate, SCALEFL_LEVELS, level, self.settings.exit_convs)

    # ---- one round ------------------------------------------------------------------------------
    def initial_state(self) -> State:
        model = level_model(
            self.substrate,
            len(SCALEFL_LEVELS) - 1,
            self.settings.exit_convs,
            seed=stream_seed(self.run.rounds.seed, Stream.INITIAL_WEIGHTS),
        )
        return {k: v.numpy().copy() for k, v in model.state_dict().items()}

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        return extract(global_state, self._shapes(self.level_of(profile)))

    def reference_params(self, global_state: State) -> int:
        return self.costs[-1].params

    def payload_params(self, profile: NodeProfile, payload: State) -> int:
        return self.costs[self.level_of(profile)].params

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        return super().train_config(server_round, profile) | {LEVEL: self.level_of(profile)}

    def points_trained(self, profile: NodeProfile) -> list[int]:
        return [self.level_of(profile)]

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """Local epochs of the node's level, its exits included."""
        return self.training_floor(self.costs[self.level_of(profile)].macs)

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        return slice_mean(global_state, replies, [1.0] * len(replies))

    # ---- evaluation ---------------------------------------------------------------------------
    def _level_with(self, state: State, level: int) -> EarlyExitResNet:
        model = level_model(self.substrate, level, self.settings.exit_convs)
        load_state(model, extract(state, self._shapes(level)))
        return model

    def servable_points(self, state: State) -> list[OperatingPoint]:
        """Every level, served by its deepest exit."""
        return [
            OperatingPoint(
                level, cost.macs, cost.params, lambda level=level: self._level_with(state, level)
            )
            for level, cost in enumerate(self.costs)
        ]

    def _levels(self, state: State, data: ImageArrays) -> list[dict[str, Any]]:
        """Each level's deepest exit after its own BN recalibration."""
        return self.points.rows(self.servable_points(state), data)

    def validate(self, state: State, data: ImageArrays) -> dict[str, float]:
        rows = self._levels(state, data)
        return points_validation(rows, lambda r: f"val-acc-level{r['index'] + 1}")

    def params_by_client(self, state: State) -> dict[int, int]:
        """The parameters of a client's level."""
        return {
            p.partition_id: self.costs[self.level_of(p)].params
            for p in self.nodes.profiles.values()
        }

    def test_report(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        rows = self._levels(state, data)
        profiles = list(self.nodes.profiles.values())
        report = operating_point_report(
            run_dir,
            f"ScaleFL on {self.run.data.source.dataset}",
            rows,
            served={p.partition_id: self.level_of(p) for p in profiles},
            budgets={p.partition_id: p.budget for p in profiles},
            trained=self.accounting.trained_points,
        )
        summary = report | {
            "clients_below_smallest_level": self.clients_below_smallest_level(),
            "scalefl_kd_form": self.settings.kd_form,
            "levels": [
                {"level": i + 1, "blocks": lv.blocks, "width": lv.width}
                for i, lv in enumerate(SCALEFL_LEVELS)
            ],
        }
        self._log_report(summary, self.communication(state))
        return summary

    def _log_report(self, summary: dict[str, Any], comm: dict[str, float]) -> None:
        log(INFO, "ScaleFL levels (deepest exit, test accuracy after per-level BN recalibration):")
        for row, level in zip(summary["variants"], summary["levels"], strict=True):
            log(
                INFO,
                "\tlevel %d (%d blocks, width %.2f) | %8.2fM MACs | %7.3fM params | %s",
                level["level"],
                level["blocks"],
                level["width"],
                row["macs"] / 1e6,
                row["params"] / 1e6,
                format_row(row),
            )
        log(
            INFO,
            "population accuracy (largest affordable level): %s; "
            "clients_below_smallest_level = %d (served level 1)",
            format_accuracy(summary["population_accuracy"], summary["population_accuracy_ci95"]),
            summary["clients_below_smallest_level"],
        )
        log(
            INFO,
            "training compute proxy: %.3f TMACs; mean payload %.3fM params per client-round",
            self.accounting.compute_total() / 1e12,
            comm.get("mean_params_per_client_round", 0.0) / 1e6,
        )

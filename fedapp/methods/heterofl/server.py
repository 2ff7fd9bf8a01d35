"""HeteroFL (Diao et al., ICLR 2021), server side, on the ResNet18 substrate.

Each client trains one of the widths {1/16, 1/8, 1/4, 1/2, 1}: by default the widest whose MACs
fit its budget; with ``heterofl.assignment = "proportion"`` the authors' fixed equal proportions
(``a1-b1-c1-d1-e1``, ``fix`` split), so every width is trained; with ``"dynamic"`` every client
draws its width anew each round from those proportions (the ``dynamic`` split, the Flower
baseline's default), so every width is trained by every client over the run. It receives the leading
("top-left") slices of the global weights at that width, with every class row of the
classifier. Replies are averaged position by position with equal weight per client (no sample
weighting), and each client's classifier rows count only for the classes it holds. The global
model keeps no BN statistics; before testing, each width gets them from the server's
calibration set (HeteroFL's sBN "stats" pass).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.intervals import format_accuracy, format_row
from fedapp.evaluation.operating_points import (
    OperatingPoint,
    operating_point_report,
    points_validation,
)
from fedapp.methods.common.evaluators import OperatingPoints
from fedapp.methods.common.reply_validation import ArraySpec, ComputeFloor, ValidReply
from fedapp.methods.common.strategy import HeterogeneousStrategy, State, point_evaluator
from fedapp.methods.heterofl.keys import LABEL_MASK, WIDTH_KEY
from fedapp.methods.heterofl.settings import HeteroFLSettings
from fedapp.models.counter import Cost, count
from fedapp.models.elastic_resnet import ElasticResNet, state_shapes
from fedapp.models.slicing import SliceAccumulator, extract
from fedapp.models.substrate import width_arch
from fedapp.models.width_scaling import WIDTHS
from fedapp.random_streams import Stream, stream_rng, stream_seed
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.run.run_models import substrate_config
from fedapp.wire.records import load_state

#: The classifier tensors whose rows are restricted to a client's classes when averaging.
CLASSIFIER = ("head.weight", "head.bias")
#: BN buffers, which static BN neither keeps nor sends.
_BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


class HeteroFLStrategy(HeterogeneousStrategy):
    """Width-sliced payloads, count averaging with label-restricted classifier rows, sBN tests."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.settings = run.section(HeteroFLSettings)
        self.config = substrate_config(self.run.substrate, self.info)
        self.costs: dict[float, Cost] = {
            rate: count(self.config, width_arch(self.config, rate)) for rate in WIDTHS
        }
        self.shapes = {rate: self._param_shapes(rate) for rate in WIDTHS}
        self.points = point_evaluator(self.run)
        self.evaluator = OperatingPoints(self.validate, self.test_report)
        self.server_round = 0  # the round being configured: dynamic widths depend on it

    def _param_shapes(self, rate: float) -> dict[str, tuple[int, ...]]:
        """Shapes of a width's weights and biases: static BN sends no running statistics."""
        shapes = state_shapes(self.config, width_arch(self.config, rate))
        return {k: s for k, s in shapes.items() if not k.endswith(_BN_BUFFERS)}

    # ---- budgets ------------------------------------------------------------------------------
    def affordable_width(self, profile: NodeProfile) -> float | None:
        """The widest width whose MACs fit the node's budget (None: not even the narrowest)."""
        affordable = [rate for rate in WIDTHS if self.costs[rate].macs <= profile.budget]
        return affordable[-1] if affordable else None

    def width_of(self, profile: NodeProfile) -> float | None:
        """The width a node trains (None: it cannot take part)."""
        if self.settings.assignment == "proportion":
            return proportion_widths(self.nodes.profiles.values())[profile.partition_id]
        if self.settings.assignment == "dynamic":
            return dynamic_widths(
                self.run.rounds.seed, self.server_round, self.run.rounds.num_clients
            )[profile.partition_id]
        return self.affordable_width(profile)

    def ineligibility(self, profile: NodeProfile) -> str | None:
        """A node that cannot afford the narrowest width cannot take part (budget assignment)."""
        if self.width_of(profile) is not None:
            return None
        return (
            f"budget {profile.budget:.0f} MACs is below the narrowest width 1/16 "
            f"({self.costs[WIDTHS[0]].macs} MACs)"
        )

    def assigned_widths(self) -> dict[int, float]:
        """Partition id -> width of each profiled node that can take part."""
        widths = {p.partition_id: self.width_of(p) for p in self.nodes.profiles.values()}
        return {pid: rate for pid, rate in widths.items() if rate is not None}

    def trained_widths(self) -> list[tuple[int, float]]:
        """(partition id, width) of every client-round so far, read from the communication
        ledger (which the checkpoint keeps): each width's payload has its own size."""
        width_of_params = {
            sum(int(np.prod(shape)) for shape in self.shapes[rate].values()): rate
            for rate in WIDTHS
        }
        return [
            (row["partition"], width_of_params[row["params"]])
            for row in self.accounting.ledger.client_rounds
        ]

    # ---- one round ------------------------------------------------------------------------------
    def configure_round(
        self, server_round: int, state: State, grid: Grid, config: ConfigRecord | None = None
    ) -> list[Message]:
        self.server_round = server_round
        return super().configure_round(server_round, state, grid, config)

    def initial_state(self) -> State:
        """The seeded full model; its BN buffers stay at their initial values (never trained)."""
        model = ElasticResNet(
            self.config, seed=stream_seed(self.run.rounds.seed, Stream.INITIAL_WEIGHTS)
        )
        return {k: v.numpy().copy() for k, v in model.state_dict().items()}

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        return extract(global_state, self.shapes[self.width_of(profile)])

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        return super().train_config(server_round, profile) | {WIDTH_KEY: self.width_of(profile)}

    def points_trained(self, profile: NodeProfile) -> list[int]:
        return [WIDTHS.index(self.width_of(profile))]

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """Local epochs of the node's width."""
        return self.training_floor(self.costs[self.width_of(profile)].macs)

    def expected_reply(self, profile: NodeProfile, payload: State) -> dict[str, ArraySpec]:
        return super().expected_reply(profile, payload) | {
            LABEL_MASK: ArraySpec((self.config.num_classes,), "float32")
        }

    def reference_params(self, global_state: State) -> int:
        return self.costs[WIDTHS[-1]].params

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        accumulator = SliceAccumulator(global_state)
        for reply in replies:
            weights = {k: v for k, v in reply.arrays.items() if k != LABEL_MASK}
            classes = np.flatnonzero(reply.arrays[LABEL_MASK] > 0.5)
            accumulator.add(weights, weight=1.0, rows=dict.fromkeys(CLASSIFIER, classes))
        return accumulator.result()

    # ---- evaluation ---------------------------------------------------------------------------
    def width_rows(self, state: State, rates: tuple[float, ...], data: ImageArrays) -> list[dict]:
        """Accuracy and loss of each width after its own BN statistics (sBN), index = position
        in WIDTHS."""
        return self.points.rows(self.width_points(state, rates), data)

    def servable_points(self, state: State) -> list[OperatingPoint]:
        """Every width."""
        return self.width_points(state, WIDTHS)

    def width_points(self, state: State, rates: tuple[float, ...]) -> list[OperatingPoint]:
        """The widths ``rates`` cut from ``state``, index = position in WIDTHS."""
        supernet = ElasticResNet(self.config)
        load_state(supernet, state)
        return [
            OperatingPoint(
                WIDTHS.index(rate),
                self.costs[rate].macs,
                self.costs[rate].params,
                partial(supernet.subnet, width_arch(self.config, rate)),
            )
            for rate in rates
        ]

    def validate(self, state: State, data: ImageArrays) -> dict[str, float]:
        """Every width; the checkpoint is selected on their mean accuracy."""
        rows = self.width_rows(state, WIDTHS, data)
        return points_validation(rows, lambda r: f"val-acc-w{r['index']}")

    def test_report(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        rows = self.width_rows(state, WIDTHS, data)
        budgets = {p.partition_id: p.budget for p in self.nodes.profiles.values()}
        affordable = {
            p.partition_id: self.affordable_width(p) for p in self.nodes.profiles.values()
        }
        # Served: the widest affordable width; a node that affords none gets the narrowest
        # width some client trained (FEAST §6's minimum-tier fallback).
        fallback = WIDTHS[min(self.accounting.trained_points, default=0)]
        assignment = self._assignment_report(budgets)
        summary = (
            operating_point_report(
                run_dir,
                f"HeteroFL on {self.run.data.source.dataset}",
                rows,
                served={
                    pid: WIDTHS.index(rate if rate is not None else fallback)
                    for pid, rate in affordable.items()
                },
                budgets=budgets,
                trained=self.accounting.trained_points,
            )
            | {
                "widths": list(WIDTHS),
                "heterofl_assignment": self.settings.assignment,
            }
            | assignment
        )
        unit = "client-rounds" if self.settings.assignment == "dynamic" else "clients"
        by_width = summary[unit.replace("-", "_") + "_by_width"]
        log(INFO, "HeteroFL widths (test accuracy after per-width BN statistics):")
        for row, rate in zip(summary["variants"], WIDTHS, strict=True):
            log(
                INFO,
                "\twidth %-6g | %8.2fM MACs | %7.3fM params | %3d %s | %s",
                rate,
                row["macs"] / 1e6,
                row["params"] / 1e6,
                by_width[f"{rate:g}"],
                unit,
                format_row(row),
            )
        log(
            INFO,
            "population accuracy (largest affordable width): %s; %s assignment, %d %s "
            "trained a width above their budget",
            format_accuracy(summary["population_accuracy"], summary["population_accuracy_ci95"]),
            summary["heterofl_assignment"],
            summary[unit.replace("-", "_") + "_above_budget"],
            unit,
        )
        return summary

    def params_by_client(self, state: State) -> dict[int, int] | None:
        """The parameters of a client's width (None under ``dynamic``: a client's payload
        changes by round, so the ledger's mean)."""
        if self.settings.assignment == "dynamic":
            return None
        return {pid: self.costs[rate].params for pid, rate in self.assigned_widths().items()}

    def _assignment_report(self, budgets: dict[int, float]) -> dict[str, Any]:
        """Who trained which width, for summary.json."""
        if self.settings.assignment == "dynamic":
            rounds = self.trained_widths()
            return {
                "client_rounds_by_width": {
                    f"{rate:g}": sum(1 for _, r in rounds if r == rate) for rate in WIDTHS
                },
                "client_rounds_above_budget": sum(
                    1 for pid, rate in rounds if self.costs[rate].macs > budgets[pid]
                ),
                "clients_left_out": 0,
            }
        assigned = self.assigned_widths()
        return {
            "clients_by_width": {
                f"{rate:g}": sum(1 for r in assigned.values() if r == rate) for rate in WIDTHS
            },
            "clients_left_out": len(budgets) - len(assigned),
            "clients_above_budget": sum(
                1 for pid, rate in assigned.items() if self.costs[rate].macs > budgets[pid]
            ),
        }


def dynamic_widths(seed: int, server_round: int, num_clients: int) -> dict[int, float]:
    """Partition id -> width in one round of the authors' ``dynamic`` split with equal
    proportions: every client draws a rate independently (official
    ``Federation.make_model_rate``: ``torch.multinomial(proportion, num_users,
    replacement=True)`` each round), here from the round's width stream."""
    rng = stream_rng(seed, Stream.HETEROFL_WIDTHS, server_round)
    return {pid: WIDTHS[k] for pid, k in enumerate(rng.integers(len(WIDTHS), size=num_clients))}


def proportion_widths(profiles: Iterable[NodeProfile]) -> dict[int, float]:
    """Partition id -> width under the authors' ``fix`` split with equal proportions
    (``a1-b1-c1-d1-e1``): the rate list a, b, c, d, e (widest first) with ``n // 5`` clients
    each, leftovers on the last rate, handed out in client order. The authors' order is the
    user index (they have no budgets); here it is descending budget (ties: partition id), so
    the widest widths go to the clients closest to affording them."""
    order = sorted(profiles, key=lambda p: (-p.budget, p.partition_id))
    per_rate = max(len(order) // len(WIDTHS), 1)
    widest_first = WIDTHS[::-1]
    return {
        p.partition_id: widest_first[min(rank // per_rate, len(WIDTHS) - 1)]
        for rank, p in enumerate(order)
    }

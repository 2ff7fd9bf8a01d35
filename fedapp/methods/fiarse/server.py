"""FIARSE (Wu et al., NeurIPS 2024): importance-aware sub-models by magnitude, on the substrate.

Each round the server sorts the global model's conv/linear values by magnitude once; a sampled
client's sub-model keeps the fraction ``min(1, budget / full MACs)`` of the full model's effective
MACs or of its values (``fiarse.budget``), ranked globally or per stage (``fiarse.topk``), and the
classifier never loses all its weights (fedapp.models.masks). The client receives the full-shape
tensors with every value below its tensor's threshold zeroed (dense on the wire; the
communication ledger counts the values it keeps plus the unmasked BN parameters) and the
thresholds, and answers with its delta. Aggregation is the
authors' sparse delta average: each position moves by the mean delta over the clients whose delta
there is non-zero (unweighted, global learning rate 1), and a position nobody changed keeps its
value. The final report serves a dense grid of MAC levels from the smallest client budget to the
full model: each point is the global model masked as a client of that budget would be, with its
own BN recalibration, and population accuracy serves each client the largest point whose
effective MACs it affords. A point is ``trained`` when its fraction is one some client trained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common.logger import log

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.intervals import format_accuracy, format_row
from fedapp.evaluation.operating_points import (
    OperatingPoint,
    operating_point_report,
    points_validation,
)
from fedapp.methods.common.evaluators import OperatingPoints
from fedapp.methods.common.reply_validation import ComputeFloor, ValidReply
from fedapp.methods.common.strategy import HeterogeneousStrategy, State, point_evaluator
from fedapp.methods.fiarse.keys import MASK_MACS, THRESHOLDS
from fedapp.methods.fiarse.settings import FiarseSettings
from fedapp.models.masks import (
    MaskFamily,
    Thresholds,
    apply_mask,
    classifier_names,
    full_model,
    mac_fraction,
    masked_names,
    value_costs,
)
from fedapp.models.slicing import is_averaged
from fedapp.random_streams import Stream, stream_seed
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.run.run_models import substrate_config
from fedapp.wire.records import load_state

#: Grid points validated every evaluation round: the smallest, the middle and the full model.
VALIDATED_POINTS = 3


def sparse_delta_average(global_state: State, deltas: Sequence[State]) -> State:
    """``theta + mean`` of the deltas at each position over the clients whose delta there is
    non-zero; positions nobody changed keep their value. Step counters are not averaged."""
    out: State = {}
    for name, old in global_state.items():
        if not (is_averaged(name) and np.issubdtype(old.dtype, np.floating)):
            out[name] = old.copy()
            continue
        total = np.zeros(old.shape, np.float64)
        changed = np.zeros(old.shape, np.int64)
        for delta in deltas:
            total += delta[name]
            changed += delta[name] != 0
        mean = np.divide(total, changed, out=np.zeros_like(total), where=changed > 0)
        out[name] = (old + mean).astype(old.dtype)
    return out


def mac_levels(smallest_budget: float, full_macs: int, count: int) -> list[float]:
    """``count`` evenly spaced MAC levels from the smallest budget (capped) to the full model."""
    low = min(float(smallest_budget), float(full_macs))
    return sorted({float(x) for x in np.linspace(low, full_macs, count)})


class FiarseStrategy(HeterogeneousStrategy):
    """Magnitude-masked payloads, sparse delta averaging, a dense grid of masked models."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.settings = run.section(FiarseSettings)
        self.config = substrate_config(self.run.substrate, self.info)
        self.points = point_evaluator(self.run)
        self.evaluator = OperatingPoints(self.validate, self.test_report)
        probe = full_model(self.config)
        size = self.info.image_size
        self.masked = masked_names(probe)
        self.classifier = classifier_names(probe)
        self.costs = value_costs(probe, torch.zeros(1, self.info.channels, size, size))
        self.full_params = sum(p.numel() for p in probe.parameters())
        self.unmasked_params = sum(
            p.numel() for n, p in probe.named_parameters() if n not in self.masked
        )
        self._family: tuple[State, MaskFamily] | None = None
        self._thresholds: dict[int, Thresholds] = {}  # node id -> this round's mask
        self._mask_macs: dict[int, int] = {}  # node id -> that mask's effective MACs

    def family(self, state: State) -> MaskFamily:
        """The masks of a global state (one sort per state, reused by every client)."""
        if self._family is None or self._family[0] is not state:
            family = MaskFamily.of(
                state,
                self.costs,
                measure=self.settings.budget,
                topk=self.settings.topk,
                classifier=self.classifier,
            )
            self._family = (state, family)
        return self._family[1]

    def sent_params(self, family: MaskFamily, thresholds: Thresholds) -> int:
        """Parameters a masked model carries: its kept values and every BN parameter."""
        return family.kept_values(thresholds) + self.unmasked_params

    def fraction_of(self, profile: NodeProfile) -> float:
        """The share of the full model a node's budget affords (MACs or values)."""
        return mac_fraction(profile.budget, self.family(self._global).full_macs)

    # ---- one round ------------------------------------------------------------------------------
    def initial_state(self) -> State:
        model = full_model(
            self.config, seed=stream_seed(self.run.rounds.seed, Stream.INITIAL_WEIGHTS)
        )
        return {k: v.numpy().copy() for k, v in model.state_dict().items()}

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        family = self.family(global_state)
        thresholds = family.mask_for_budget(profile.budget)
        self._thresholds[profile.node_id] = thresholds
        self._mask_macs[profile.node_id] = family.effective_macs(thresholds)
        return apply_mask(global_state, self.masked, thresholds)

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        thresholds = self._thresholds[profile.node_id]
        return super().train_config(server_round, profile) | {
            THRESHOLDS: [thresholds[n] for n in self.masked],
            MASK_MACS: self._mask_macs[profile.node_id],
        }

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """Local epochs at the effective MACs of the node's mask (what its config says)."""
        return self.training_floor(self._mask_macs[profile.node_id])

    def points_trained(self, profile: NodeProfile) -> list[float]:
        """The node trained the mask of its own fraction."""
        return [self.fraction_of(profile)]

    def reference_params(self, global_state: State) -> int:
        return self.full_params

    def payload_params(self, profile: NodeProfile, payload: State) -> int:
        return self.sent_params(self.family(self._global), self._thresholds[profile.node_id])

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        return sparse_delta_average(global_state, [r.arrays for r in replies])

    # ---- evaluation ---------------------------------------------------------------------------
    def grid_fractions(self, state: State) -> list[float]:
        """Fractions of the ``fiarse.grid-points`` MAC levels, smallest first."""
        full = self.family(state).full_macs
        budgets = [p.budget for p in self.nodes.profiles.values()] or [
            self.run.data.budgets.budget_min
        ]
        levels = mac_levels(min(budgets), full, self.settings.grid_points)
        return [mac_fraction(level, full) for level in levels]

    def servable_points(self, state: State) -> list[OperatingPoint]:
        """The grid's masked models: each a dense network whose pruned weights are zero."""
        return self.grid(state)

    def grid(self, state: State) -> list[OperatingPoint]:
        """The masked models at the grid's fractions, smallest first."""
        family = self.family(state)
        points = []
        for index, fraction in enumerate(self.grid_fractions(state)):
            thresholds = family.mask(fraction)
            points.append(
                OperatingPoint(
                    index,
                    family.effective_macs(thresholds),
                    self.sent_params(family, thresholds),
                    lambda t=thresholds: self._masked_model(state, t),
                )
            )
        return points

    def trained_grid_points(self, state: State) -> set[int]:
        """Grid indices whose fraction some client trained (its budget's, capped at 1)."""
        return {
            index
            for index, fraction in enumerate(self.grid_fractions(state))
            if any(math.isclose(fraction, f, rel_tol=1e-9) for f in self.accounting.trained_points)
        }

    def _masked_model(self, state: State, thresholds: Thresholds) -> torch.nn.Module:
        model = full_model(self.config)
        load_state(model, apply_mask(state, self.masked, thresholds))
        return model

    def validate(self, state: State, data: ImageArrays) -> dict[str, float]:
        points = self.grid(state)
        picked = sorted({round(x) for x in np.linspace(0, len(points) - 1, VALIDATED_POINTS)})
        rows = self.points.rows([points[i] for i in picked], data)
        return points_validation(rows, lambda r: f"val-acc-p{r['index']}")

    def params_by_client(self, state: State) -> dict[int, int]:
        """The values a client's masked model keeps of ``state``."""
        family = self.family(state)
        return {
            p.partition_id: self.sent_params(family, family.mask_for_budget(p.budget))
            for p in self.nodes.profiles.values()
        }

    def test_report(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        points = self.grid(state)
        family = self.family(state)
        fractions = self.grid_fractions(state)
        rows = [
            row
            | {
                "fraction": fraction,
                "kept_fraction": family.kept_fraction(family.mask(fraction)),
                "effective_macs": row["macs"],
            }
            for row, fraction in zip(self.points.rows(points, data), fractions, strict=True)
        ]
        profiles = list(self.nodes.profiles.values())
        served = {
            p.partition_id: max(
                (r["index"] for r in rows if r["macs"] <= p.budget), default=rows[0]["index"]
            )
            for p in profiles
        }
        report = operating_point_report(
            run_dir,
            f"FIARSE on {self.run.data.source.dataset}",
            rows,
            served=served,
            budgets={p.partition_id: p.budget for p in profiles},
            trained=self.trained_grid_points(state),
        )
        summary = report | {
            "fiarse_budget": self.settings.budget,
            "fiarse_topk": self.settings.topk,
        }
        log_points(summary, self.communication(state))
        return summary


def log_points(summary: dict[str, Any], comm: dict[str, float]) -> None:
    """The grid and the population accuracy on the console."""
    log(
        INFO,
        "FIARSE masked models, budget as %s, %s top-k (test accuracy after per-point BN "
        "recalibration):",
        summary["fiarse_budget"],
        summary["fiarse_topk"],
    )
    for v in summary["variants"]:
        log(
            INFO,
            "\tpoint %2d | fraction %.4f | kept %.4f of values | %8.2fM effective MACs | "
            "%7.3fM params | %s%s",
            v["index"],
            v["fraction"],
            v["kept_fraction"],
            v["macs"] / 1e6,
            v["params"] / 1e6,
            format_row(v),
            "" if v["trained"] else " (no client trained it)",
        )
    log(
        INFO,
        "population accuracy (largest affordable point): %s; %.3fM params per client-round",
        format_accuracy(summary["population_accuracy"], summary["population_accuracy_ci95"]),
        comm.get("mean_params_per_client_round", 0.0) / 1e6,
    )

"""FedDF (Lin, Kong, Stich, Jaggi, NeurIPS 2020): heterogeneous prototypes, FedAvg per
prototype, then server ensemble distillation into each prototype on unlabeled public images.

Every client trains the largest candidate of the run's family (``candidates.family``) its budget
affords, its *prototype*. The global state holds every served prototype, its tensors named
``<prototype>/<tensor>``; a client receives only its own prototype's tensors. Each round: uniform
(1/n, the authors') FedAvg within each prototype, then each prototype that received models is
distilled from the mean logits of all received models of all prototypes
(fedapp.training.ensemble_distillation). The server uses only the public split's images, never its
labels (fedapp.run.federated_data.public_images withholds them).

Evaluation: each prototype on the held-out data; the reported test accuracy is the population
accuracy (mean over clients of the accuracy of the prototype each is served), reported in the
same operating-point format as the weight-sharing methods, with per-prototype rows.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common.logger import log
from torch import nn

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.intervals import format_accuracy, format_row
from fedapp.evaluation.operating_points import (
    EVAL_BATCH_SIZE,
    OperatingPoint,
    operating_point_report,
)
from fedapp.evaluation.results import write_csv
from fedapp.methods.common.evaluators import OperatingPoints
from fedapp.methods.common.reply_validation import ComputeFloor, ValidReply
from fedapp.methods.common.strategy import (
    HeterogeneousStrategy,
    State,
    float_elements,
    point_evaluator,
)
from fedapp.methods.feddf.keys import PROTOTYPE
from fedapp.methods.feddf.settings import FedDFSettings
from fedapp.models.budgets import BudgetError
from fedapp.models.families import Candidate, build_candidate, largest_affordable
from fedapp.models.slicing import SliceAccumulator
from fedapp.models.zoo import forward_macs
from fedapp.random_streams import Stream, stream_seed
from fedapp.run.context import RunContext
from fedapp.run.federated_data import public_images, server_set
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.run.run_models import run_candidates
from fedapp.training.ensemble_distillation import DistillSettings, distil, ensemble_logits
from fedapp.training.loops import eval_loader, evaluate, seed_local_work
from fedapp.wire.messages import ACCURACY, LOSS, SELECTION_KEY
from fedapp.wire.records import load_state

SEPARATOR = "/"  # between a prototype's name and its tensor's name in the global state
DISTILLATION_FILE = "distillation.csv"  # per round and prototype: steps, best step, accuracies


def prototype_state(state: State, prototype: str) -> State:
    """One prototype's tensors, under their model names."""
    prefix = prototype + SEPARATOR
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def prefixed(prototype: str, tensors: State) -> State:
    """A prototype's tensors under their global-state names."""
    return {prototype + SEPARATOR + k: v for k, v in tensors.items()}


def uniform_average(global_state: State, replies: list[tuple[str, State]]) -> State:
    """Per-prototype FedAvg with weight 1/n among the n models of each prototype; prototypes
    that received nothing keep their tensors (one accumulator: their names never overlap)."""
    accumulator = SliceAccumulator(global_state)
    for prototype, tensors in replies:
        accumulator.add(prefixed(prototype, tensors), weight=1.0)
    return accumulator.result()


class FedDFStrategy(HeterogeneousStrategy):
    """Prototype payloads, uniform per-prototype FedAvg, server ensemble distillation."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.candidates = run_candidates(self.run.family, self.info)
        self.public = public_images(self.run.data)  # images only: labels withheld
        self.validation = server_set(self.run.data, "validation")
        self.points = point_evaluator(self.run)
        self.evaluator = OperatingPoints(self.validate, self.test_report)
        feddf = run.section(FedDFSettings)
        self.settings = DistillSettings(
            steps=feddf.distill_steps,
            eval_every=feddf.distill_eval_every,
            patience=feddf.distill_patience,
            batch_size=feddf.distill_batch_size,
            lr=feddf.distill_lr,
            grad_clip=feddf.distill_grad_clip,
            temperature=feddf.kd_temperature,
        )
        self.served: list[Candidate] = []  # the prototypes in the global state, by MACs
        self.distillations: list[dict[str, Any]] = []

    def accounts(self) -> dict[str, Any]:
        """The base's records and every round's distillation outcome (summary.json lists them)."""
        return super().accounts() | {"distillations": [dict(r) for r in self.distillations]}

    def restore_accounts(self, accounts: dict[str, Any]) -> None:
        super().restore_accounts(accounts)
        self.distillations = [dict(r) for r in accounts["distillations"]]

    # ---- prototypes ------------------------------------------------------------------------
    def prototype_of(self, profile: NodeProfile) -> Candidate:
        """The largest candidate of the family within the node's budget."""
        return largest_affordable(self.candidates, profile.budget)

    def ineligibility(self, profile: NodeProfile) -> str | None:
        """A node that affords no candidate, or (joining late) one outside the global state,
        cannot take part."""
        try:
            prototype = self.prototype_of(profile)
        except BudgetError as err:
            return str(err)
        if self.served and prototype not in self.served:
            return f"its prototype {prototype.name} is not in the global state"
        return None

    def _model(self, prototype: str, tensors: State | None = None) -> nn.Module:
        model = build_candidate(prototype, self.info)
        if tensors is not None:
            load_state(model, tensors)
        return model

    # ---- one round -------------------------------------------------------------------------
    def initial_state(self) -> State:
        """Every prototype served to a profiled node, each initialised with the run's seed."""
        served = {self.prototype_of(p) for p in self.nodes.profiles.values() if self.eligible(p)}
        self.served = sorted(served, key=lambda c: c.macs)
        state: State = {}
        for prototype in self.served:
            torch.manual_seed(stream_seed(self.run.rounds.seed, Stream.INITIAL_WEIGHTS))
            tensors = self._model(prototype.name).state_dict()
            state |= prefixed(prototype.name, {k: v.numpy().copy() for k, v in tensors.items()})
        return state

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        return prototype_state(global_state, self.prototype_of(profile).name)

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        return super().train_config(server_round, profile) | {
            PROTOTYPE: self.prototype_of(profile).name
        }

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """Local epochs of the node's prototype."""
        return self.training_floor(forward_macs(self.prototype_of(profile).name, self.info))

    def reference_params(self, global_state: State) -> int:
        """What a single-model method would send: the largest served prototype."""
        return float_elements(prototype_state(global_state, self.served[-1].name))

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        received = [
            (self.prototype_of(self.nodes.profiles[r.node_id]).name, r.arrays) for r in replies
        ]
        averaged = uniform_average(global_state, received)
        teacher = ensemble_logits(
            [self._model(name, tensors) for name, tensors in received],
            self.public,
            self.info,
            self.device,
        )
        for index, prototype in enumerate(self.served):
            if all(name != prototype.name for name, _ in received):
                continue
            student = self._model(prototype.name, prototype_state(averaged, prototype.name))
            outcome = distil(
                student,
                self.public,
                teacher,
                self.info,
                self.settings,
                self._validation_accuracy,
                seed_local_work(
                    self.run.rounds.seed, Stream.FEDDF_DISTILLATION, server_round, index
                ),
                self.device,
            )
            distilled = {k: v.detach().cpu().numpy() for k, v in student.state_dict().items()}
            averaged |= prefixed(prototype.name, distilled)
            row = {"round": server_round, PROTOTYPE: prototype.name} | vars(outcome)
            self.distillations.append(row)
            log(
                INFO,
                "FedDF round %d: %s distilled %d steps, validation %.2f%% (FedAvg) -> %.2f%% "
                "(step %d)",
                server_round,
                prototype.name,
                outcome.steps_run,
                100 * outcome.start_accuracy,
                100 * outcome.best_accuracy,
                outcome.best_step,
            )
        return averaged

    def _validation_accuracy(self, model: nn.Module) -> float:
        loader = eval_loader(self.validation, self.info, EVAL_BATCH_SIZE)
        return evaluate(model, loader, self.device)[ACCURACY]

    # ---- evaluation ------------------------------------------------------------------------
    def _prototype_rows(self, state: State, data: ImageArrays) -> list[dict[str, Any]]:
        """Each served prototype's accuracy and loss on the data (its own BN statistics)."""
        return self.points.rows(self.servable_points(state), data)

    def servable_points(self, state: State) -> list[OperatingPoint]:
        """Each prototype the state holds (the served ones), by MACs, index = position in
        ``served``."""
        held = [c for c in self.candidates if prototype_state(state, c.name)]
        return [
            OperatingPoint(
                index,
                prototype.macs,
                prototype.params,
                lambda p=prototype.name: self._model(p, prototype_state(state, p)),
                recalibrate=False,
            )
            for index, prototype in enumerate(sorted(held, key=lambda c: c.macs))
        ]

    def points_trained(self, profile: NodeProfile) -> list[int]:
        """The node trained its own prototype."""
        return [self.served.index(self.prototype_of(profile))]

    def _served_index(self) -> dict[int, int]:
        """Partition id -> index (in ``served``) of the prototype the client is served."""
        return {
            p.partition_id: self.served.index(self.prototype_of(p))
            for p in self.nodes.profiles.values()
            if self.eligible(p)
        }

    def _population_mean(self, rows: list[dict[str, Any]], key: str) -> float:
        by_index = {row["index"]: row[key] for row in rows}
        return float(np.mean([by_index[i] for i in self._served_index().values()]))

    def validate(self, state: State, data: ImageArrays) -> dict[str, float]:
        rows = self._prototype_rows(state, data)
        metrics = {f"val-acc-{self.served[r['index']].name}": r[ACCURACY] for r in rows}
        metrics["val-loss"] = self._population_mean(rows, LOSS)
        metrics[SELECTION_KEY] = self._population_mean(rows, ACCURACY)
        return metrics

    def params_by_client(self, state: State) -> dict[int, int]:
        """The parameters of a client's prototype."""
        params = [float_elements(prototype_state(state, c.name)) for c in self.served]
        return {pid: params[index] for pid, index in self._served_index().items()}

    def test_report(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        rows = self._prototype_rows(state, data)
        served = self._served_index()
        report = operating_point_report(
            run_dir,
            f"FedDF on {self.run.data.source.dataset}",
            rows,
            served=served,
            budgets={p.partition_id: p.budget for p in self.nodes.profiles.values()},
            trained=self.accounting.trained_points,
        )
        if self.distillations:
            write_csv(run_dir / DISTILLATION_FILE, self.distillations)
        summary = report | {
            "test_accuracy": report["population_accuracy"],
            "test_loss": self._population_mean(rows, LOSS),
            "test_accuracy_is": "population accuracy: mean over clients of their prototype's",
            "largest_prototype_test_accuracy": rows[-1][ACCURACY],
            "prototypes": [
                {"name": self.served[r["index"]].name, "clients": list(served.values()).count(i)}
                | r
                for i, r in enumerate(rows)
            ],
            "distillation": self.distillations,
        }
        log(
            INFO,
            "FedDF: population accuracy %s; per prototype %s",
            format_accuracy(summary["population_accuracy"], summary["population_accuracy_ci95"]),
            ", ".join(f"{p['name']} {format_row(p)}" for p in summary["prototypes"]),
        )
        return summary

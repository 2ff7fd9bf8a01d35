"""The few ways a method is measured; every strategy supplies one as its ``evaluator``.

- :class:`GlobalModel`: one global model, evaluated on the server's split (FedAvg).
- :class:`OperatingPoints`: many operating points of one global state (FEAST's variants,
  HeteroFL's widths, ScaleFL's levels, FIARSE's masks, FedDF's prototypes), the checkpoint
  selected on what the method validates, the final report serving each budget a point.
- :class:`ClientModels`: models that live on the clients (FedKD-NAS, Local-KD, FedMD,
  FedDistill), each node evaluating its own on a server-held split, reported as the unweighted
  mean over clients, as these methods' papers do.

The round engine asks the evaluator for validation on the run's cadence (the best checkpoint is
the round with the highest ``SELECTION_KEY``) and for the one final test of that checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from flwr.serverapp import Grid

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.results import write_csv
from fedapp.methods.common.client_evaluation import Row, client_evaluation, unweighted_mean
from fedapp.run.context import RunContext
from fedapp.run.federated_data import server_set
from fedapp.run.profiles import NodeRegistry
from fedapp.wire.messages import ACCURACY, LOSS, NUM_EXAMPLES, SELECTION_KEY

State = dict[str, np.ndarray]
Metrics = dict[str, float]

CLIENTS_FILE = "clients.csv"  # each client's model and its test accuracy


class Evaluator(Protocol):
    """What the round engine asks of a method's evaluation."""

    def validation_metrics(self, state: State, data: ImageArrays) -> Metrics:
        """Validation of ``state``; must include SELECTION_KEY."""

    def test_summary(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        """The one final test of the selected checkpoint, for summary.json (tables and plots
        go into ``run_dir``)."""


@dataclass(frozen=True)
class GlobalModel:
    """One global model; ``evaluate`` gives its 'loss', 'accuracy' and 'examples' on a split."""

    evaluate: Callable[[State, ImageArrays], Metrics]

    def validation_metrics(self, state: State, data: ImageArrays) -> Metrics:
        result = self.evaluate(state, data)
        return {"val-loss": result[LOSS], SELECTION_KEY: result[ACCURACY]}

    def test_summary(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        result = self.evaluate(state, data)
        return {
            "test_accuracy": result[ACCURACY],
            "test_loss": result[LOSS],
            "test_examples": result["examples"],
        }


@dataclass(frozen=True)
class OperatingPoints:
    """Many operating points of one global state: ``validate`` measures those validated each
    cadence round (with SELECTION_KEY), ``report`` tests every point once and serves each
    client's budget one of them."""

    validate: Callable[[State, ImageArrays], Metrics]
    report: Callable[[State, ImageArrays, Path], dict[str, Any]]

    def validation_metrics(self, state: State, data: ImageArrays) -> Metrics:
        return self.validate(state, data)

    def test_summary(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        return self.report(state, data, run_dir)


class ClientModels:
    """Models that live on the clients: every profiled node evaluates its own on a server-held
    split (``client_evaluation``: a bad reply is dropped and logged), the clients' unweighted
    mean is the method's result. The server holds none of these models, so the final test
    measures them after the last round, not at a restored checkpoint."""

    def __init__(
        self,
        run: RunContext,
        nodes: NodeRegistry,
        grid: Callable[[], Grid | None],
        required: Iterable[str] = (),
        read: Callable[[Row], Row] = dict,
        extra_report: Callable[[ImageArrays, Path], dict[str, Any]] | None = None,
    ) -> None:
        self.run = run
        self.nodes = nodes
        #: The grid of the run's last training round (None before the first).
        self.grid = grid
        #: The metrics a method reads from every evaluation reply besides accuracy and loss.
        self.required = frozenset(required)
        #: A method's reading of a valid row; whatever it raises drops the reply.
        self.read = read
        #: What a method adds to the final test summary (e.g. FedKD-NAS's teacher and choices).
        self.extra_report = extra_report

    def mean(self, split: str) -> tuple[Metrics, list[Row]]:
        """Unweighted mean accuracy and loss over the clients' models on a split (NaN when no
        client answered validly), and the per-client rows, each claiming no more examples
        than the split holds."""
        grid = self.grid()
        if grid is None:
            raise RuntimeError("client evaluation needs a grid: run a training round first")
        rows = client_evaluation(
            grid,
            self.nodes,
            split,
            self.run.rounds.round_timeout,
            split_size=len(server_set(self.run.data, split).labels),
            required=self.required,
            read=self.read,
        )
        return unweighted_mean(rows), rows

    def answered_mean(self, split: str) -> tuple[Metrics, list[Row]]:
        """:meth:`mean` where it is the method's only result: an error when no client answered."""
        mean, rows = self.mean(split)
        if not rows:
            raise RuntimeError(f"no client returned a valid {split} evaluation")
        return mean, rows

    def validation_metrics(self, state: State, data: ImageArrays) -> Metrics:
        mean, rows = self.answered_mean("validation")
        return {"val-loss": mean[LOSS], SELECTION_KEY: mean[ACCURACY], "val-clients": len(rows)}

    def test_summary(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        mean, rows = self.answered_mean("test")
        write_csv(run_dir / CLIENTS_FILE, rows)
        summary = {
            "test_accuracy": mean[ACCURACY],
            "test_loss": mean[LOSS],
            "test_examples": int(rows[0][NUM_EXAMPLES]),
            "test_clients": len(rows),
            "clients": rows,
        }
        if self.extra_report is not None:
            summary |= self.extra_report(data, run_dir)
        return summary

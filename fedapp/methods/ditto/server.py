"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): FedAvg for the global model, and on every client a
personal model regularised towards it (fedapp.methods.ditto.client).

The server side is FedAvg's (sample-weighted mean, as PFLlib's Ditto server; the official code
adds the uniform mean of the deltas). What Ditto adds is evaluation: the global model is
evaluated centrally, and each node evaluates its own personal model on the same server-held
split (``ClientModels``). Checkpoints select on the global model (the only state the server
holds); the personal models evaluated at the end are the clients' latest ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.intervals import format_measured
from fedapp.evaluation.results import write_csv
from fedapp.methods.common.evaluators import ClientModels, GlobalModel
from fedapp.methods.common.strategy import State
from fedapp.methods.common.whole_model_server import WholeModelStrategy
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeRegistry
from fedapp.wire.messages import ACCURACY, LOSS

PERSONAL_FILE = "personal.csv"  # one row per client: its personal model's test accuracy and loss


@dataclass(frozen=True)
class GlobalAndPersonal:
    """The global model (it selects the checkpoint) and, beside it, the clients' personal
    models, whose mean is Ditto's test accuracy."""

    global_model: GlobalModel
    personal: ClientModels

    def validation_metrics(self, state: State, data: ImageArrays) -> dict[str, float]:
        metrics = self.global_model.validation_metrics(state, data)
        personal, rows = self.personal.mean("validation")
        if rows:
            metrics["val-personal-accuracy"] = personal[ACCURACY]
            metrics["val-personal-loss"] = personal[LOSS]
        return metrics

    def test_summary(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        """The personal models' mean as the test accuracy, the global model's beside it."""
        global_result = self.global_model.test_summary(state, data, run_dir)
        personal, rows = self.personal.mean("test")
        if rows:
            write_csv(run_dir / PERSONAL_FILE, rows)
        log(
            INFO,
            "Ditto: personal models %s (mean over %d clients), global model %s",
            format_measured(personal[ACCURACY], len(data.labels)),
            len(rows),
            format_measured(global_result["test_accuracy"], len(data.labels)),
        )
        return global_result | {
            "test_accuracy": personal[ACCURACY],
            "test_loss": personal[LOSS],
            "test_accuracy_is": "mean over clients of the personal model's test accuracy",
            "personal_clients": len(rows),
            "personal": rows,
            "global_test_accuracy": global_result["test_accuracy"],
            "global_test_loss": global_result["test_loss"],
        }


class DittoStrategy(WholeModelStrategy):
    """FedAvg, measured on its global model and on the clients' personal models."""

    models_trained = 2  # the global copy, then the personal model on the same shard

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.evaluator = GlobalAndPersonal(
            GlobalModel(self.evaluate), ClientModels(run, nodes, self.last_grid)
        )

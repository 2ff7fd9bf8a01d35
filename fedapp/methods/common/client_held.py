"""Server side of the logit-exchange methods whose models live on the clients: FedMD,
FedDistill, and FedKD-NAS with its ablation Local-KD (their server may add a teacher).

The server holds no client model, only logits (FedMD's consensus, FedDistill's per-label means,
FedKD-NAS's public-set logits and its teacher's), so it evaluates by asking every node to evaluate
its own kept model (``client_evaluation``) and reports the unweighted mean over clients, as these
methods' papers do. The final test therefore measures the clients' models after the last round:
they are not on the server, so no best-round checkpoint of them can be restored (the server's
checkpoint holds only its logits).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.results import write_csv
from fedapp.methods.common.strategy import HeterogeneousStrategy, State
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.run.run_models import run_candidates
from fedapp.wire.messages import ACCURACY, LOSS, NUM_EXAMPLES, SELECTION_KEY

CLIENTS_FILE = "clients.csv"  # each client's model and its test accuracy


class ClientHeldStrategy(HeterogeneousStrategy):
    """Evaluation through the clients' own models; nodes that afford no candidate sit out."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.cheapest_macs = run_candidates(self.run.family, self.info)[0].macs

    def ineligibility(self, profile: NodeProfile) -> str | None:
        if profile.budget >= self.cheapest_macs:
            return None
        return (
            f"budget {profile.budget:.0f} MACs is below the family's cheapest candidate "
            f"({self.cheapest_macs} MACs)"
        )

    def evaluate(self, state: State, data: ImageArrays) -> dict[str, float]:
        """Not used: the data the clients evaluate on is named by split (see client_evaluation)."""
        raise NotImplementedError("models live on the clients: use client_evaluation(split)")

    def client_mean(self, split: str) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The clients' mean (the method's only model): an error when no client answered."""
        mean, rows = super().client_mean(split)
        if not rows:
            raise RuntimeError(f"no client returned a valid {split} evaluation")
        return mean, rows

    def validation_metrics(self, state: State, data: ImageArrays) -> dict[str, float]:
        mean, rows = self.client_mean("validation")
        return {"val-loss": mean[LOSS], SELECTION_KEY: mean[ACCURACY], "val-clients": len(rows)}

    def test_summary(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        mean, rows = self.client_mean("test")
        write_csv(run_dir / CLIENTS_FILE, rows)
        return {
            "test_accuracy": mean[ACCURACY],
            "test_loss": mean[LOSS],
            "test_examples": int(rows[0][NUM_EXAMPLES]),
            "test_clients": len(rows),
            "clients": rows,
        }

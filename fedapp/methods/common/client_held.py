"""Server side of the logit-exchange methods whose models live on the clients: FedMD,
FedDistill, and FedKD-NAS with its ablation Local-KD (their server may add a teacher).

The server holds no client model, only logits (FedMD's consensus, FedDistill's per-label means,
FedKD-NAS's public-set logits and its teacher's), so it evaluates by asking every node to evaluate
its own kept model (``ClientModels``) and reports the unweighted mean over clients, as these
methods' papers do. The final test therefore measures the clients' models after the last round:
they are not on the server, so no best-round checkpoint of them can be restored (the server's
checkpoint holds only its logits).
"""

from __future__ import annotations

from fedapp.evaluation.operating_points import OperatingPoint
from fedapp.methods.common.evaluators import ClientModels
from fedapp.methods.common.own_model import own_candidate
from fedapp.methods.common.strategy import HeterogeneousStrategy, NotServable, State
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.run.run_models import run_candidates


class ClientHeldStrategy(HeterogeneousStrategy):
    """Evaluation through the clients' own models; nodes that afford no candidate sit out."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.cheapest_macs = run_candidates(self.run.family, self.info)[0].macs
        self.evaluator = ClientModels(run, nodes, self.last_grid)

    def ineligibility(self, profile: NodeProfile) -> str | None:
        if profile.budget >= self.cheapest_macs:
            return None
        return (
            f"budget {profile.budget:.0f} MACs is below the family's cheapest candidate "
            f"({self.cheapest_macs} MACs)"
        )

    def own_model_macs(self, profile: NodeProfile) -> int:
        """Forward MACs of the model a node keeps (the largest candidate its budget affords)."""
        return own_candidate(self.run, self.info, profile.budget).macs

    def servable_points(self, state: State) -> list[OperatingPoint]:
        """None: each client keeps its own model, which never reaches the server."""
        raise NotServable(
            f"strategy {self.run.strategy!r} keeps its models on the clients (each node trains, "
            "keeps and evaluates its own; the server holds only logits): its run folder holds "
            "no model to export"
        )

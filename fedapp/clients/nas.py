"""The client NAS controller of FedKD-NAS (spec fedkd-nas.md, "Client NAS controller"; rule: ours).

Every round a client picks the architecture it trains from the run's candidate family:
- feasible set: candidates whose forward MACs fit the client's budget and whose training-memory
  estimate fits ``nas-memory-mb`` (0: no memory limit; the same for every client);
- first round: the largest feasible candidate;
- score(a) = hold-out accuracy of a after its last local training - lambda * MACs(a) / budget;
  a candidate never trained scores as if its accuracy were 1 (optimism: each gets tried once
  unless its cost alone rules it out);
- hysteresis: the incumbent (last round's choice) is kept unless the best score beats its score
  by more than the margin delta, so the choice does not oscillate between near-equal candidates.
The client keeps the weights of at most ``nas-keep`` candidates it trained (least recently used
evicted) and warm-starts from them. All of it lives in the node's Flower state, so it survives
between rounds in simulation and on a device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import RecordDict

from fedapp.clients.node_state import forget, load_arrays, load_values, save_arrays, save_values
from fedapp.config import RunConfig
from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.models.families import Candidate, affordable
from fedapp.models.routing import BudgetError
from fedapp.run_models import BYTES_PER_MB, memory_budget, run_candidates, run_family

HISTORY_KEY = "nas-history"
WEIGHTS_KEY = "nas-weights:"  # + candidate name
#: Accuracy assumed for a candidate the client has not trained yet.
OPTIMISTIC_ACCURACY = 1.0


@dataclass
class NasHistory:
    """What a client remembers about its candidates between rounds."""

    accuracy: dict[str, float] = field(default_factory=dict)  # last hold-out accuracy per name
    incumbent: str = ""  # last round's choice ("" before the first)
    kept: list[str] = field(default_factory=list)  # names with kept weights, least recent first

    @classmethod
    def load(cls, state: RecordDict) -> NasHistory:
        values = load_values(state, HISTORY_KEY)
        if values is None:
            return cls()
        names, scores = list(values["tried"]), list(values["tried-accuracy"])
        accuracy = dict(zip(names, map(float, scores), strict=True))
        return cls(accuracy, str(values["incumbent"]), list(values["kept"]))

    def save(self, state: RecordDict) -> None:
        save_values(
            state,
            HISTORY_KEY,
            {
                "tried": list(self.accuracy),
                "tried-accuracy": list(self.accuracy.values()),
                "incumbent": self.incumbent,
                "kept": self.kept,
            },
        )


@dataclass(frozen=True)
class Choice:
    """The architecture picked for this round and why."""

    candidate: Candidate
    score: float
    switched: bool  # differs from the incumbent
    untried: bool  # scored optimistically


def feasible_candidates(cfg: RunConfig, info: DatasetInfo, budget: float) -> list[Candidate]:
    """The run family's candidates this client can train; BudgetError when there is none."""
    candidates = run_candidates(cfg, info)
    fitting = affordable(candidates, budget, memory_budget(cfg))
    if not fitting:
        cheapest = candidates[0]
        raise BudgetError(
            f"budget {budget:,.0f} MACs (memory {cfg.nas_memory_mb:g} MB) affords no candidate "
            f"of {run_family(cfg)}; the cheapest is {cheapest.name} ({cheapest.macs:,} MACs, "
            f"{cheapest.train_memory_bytes / BYTES_PER_MB:.1f} MB)"
        )
    return fitting


def score(candidate: Candidate, history: NasHistory, budget: float, lam: float) -> float:
    """Hold-out accuracy (optimistic if untried) minus lambda * the share of budget it uses."""
    accuracy = history.accuracy.get(candidate.name, OPTIMISTIC_ACCURACY)
    return accuracy - lam * candidate.macs / budget


def choose(
    feasible: Sequence[Candidate], history: NasHistory, budget: float, lam: float, margin: float
) -> Choice:
    """The best-scoring feasible candidate, unless the incumbent is within ``margin`` of it
    (ties between scores go to the cheaper candidate). A client without an incumbent starts from
    the largest feasible candidate: what its budget affords, before any score exists."""
    scores = {c.name: score(c, history, budget, lam) for c in feasible}
    best = max(feasible, key=lambda c: (scores[c.name], -c.macs))
    incumbent = next((c for c in feasible if c.name == history.incumbent), None)
    if not history.accuracy:
        picked = max(feasible, key=lambda c: c.macs)
    elif incumbent is not None and scores[best.name] <= scores[incumbent.name] + margin:
        picked = incumbent
    else:
        picked = best
    return Choice(
        candidate=picked,
        score=scores[picked.name],
        switched=picked.name != history.incumbent,
        untried=picked.name not in history.accuracy,
    )


def record(history: NasHistory, name: str, holdout_accuracy: float) -> None:
    """After training ``name``: its new hold-out accuracy; it becomes the incumbent."""
    history.accuracy[name] = holdout_accuracy
    history.incumbent = name


def warm_start(state: RecordDict, name: str) -> dict[str, np.ndarray] | None:
    """The kept weights of a candidate trained before, or None (train from scratch)."""
    return load_arrays(state, WEIGHTS_KEY + name)


def keep_weights(
    state: RecordDict, history: NasHistory, name: str, weights: Mapping[str, np.ndarray], keep: int
) -> None:
    """Keep ``name``'s weights as the most recently used; evict beyond ``keep`` candidates."""
    save_arrays(state, WEIGHTS_KEY + name, weights)
    history.kept = [n for n in history.kept if n != name] + [name]
    while len(history.kept) > keep:
        forget(state, WEIGHTS_KEY + history.kept.pop(0))


def holdout_split(
    shard: ImageArrays, fraction: float, seed: int, partition_id: int
) -> tuple[ImageArrays, ImageArrays]:
    """(training part, hold-out part) of a shard, the same split every round; at least one
    example on each side."""
    n = len(shard.labels)
    held = min(max(1, round(fraction * n)), n - 1)
    order = np.random.default_rng([seed, partition_id]).permutation(n)
    train, holdout = np.sort(order[held:]), np.sort(order[:held])
    return (
        ImageArrays(shard.images[train], shard.labels[train]),
        ImageArrays(shard.images[holdout], shard.labels[holdout]),
    )

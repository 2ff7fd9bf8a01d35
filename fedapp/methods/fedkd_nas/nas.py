"""The client NAS controller of FedKD-NAS (its switching rule is fedapp's own).

Every round a client trains one architecture from the run's candidate family:
- feasible set: candidates whose forward MACs fit the client's budget and whose training-memory
  estimate fits ``fedkd-nas.memory-mb`` (0: no memory limit; the same for every client);
- it starts at its largest feasible candidate (what its budget affords, before any score exists)
  and keeps training that incumbent;
- every ``fedkd-nas.duel-every``-th round the client trains, it also trains one challenger in a
  duel: the rival whose last measurement is the oldest (never measured first, larger first),
  warm-started from its kept weights and ``fedkd-nas.warmup-steps`` KD steps on the public set,
  then given exactly the incumbent's local training of that round (same batches, same steps);
- score(a) = hold-out accuracy after that round - lambda * MACs(a) / budget, on
  a share of the public set kept out of KD, as top-1 agreement with the broadcast target
  (``fedkd-nas.score-on = "public"``: the global distribution, which a label-skewed shard's hold-out
  does not measure), or on a share of the client's shard (``"private"``); the challenger replaces
  the incumbent only if it beats it by more than the margin, and the margin is never finer than
  one hold-out example (1 / hold-out size), so a switch is never decided by the hold-out's noise.
Decisions only ever compare two scores measured in the same round after the same number of
training steps; older measurements only decide which rival duels next (stale ones first), so an
untrained or stale score cannot lock a client in (docs/methods/fedkd-nas.md shows a controller
that kept stale scores leaving half the clients on the smallest candidate).
The client keeps the weights of at most ``fedkd-nas.keep`` candidates (least recently used evicted).
All of it lives in the node's Flower state, so it survives between rounds in simulation and on a
device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import RecordDict

from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.methods.common.node_state import (
    forget,
    load_arrays,
    load_values,
    save_arrays,
    save_values,
)
from fedapp.methods.fedkd_nas.settings import FedKDNASSettings
from fedapp.models.budgets import BudgetError
from fedapp.models.families import Candidate, affordable
from fedapp.random_streams import Stream, stream_rng
from fedapp.run.context import RunContext
from fedapp.run.run_models import run_candidates, run_family

BYTES_PER_MB = 2**20
HISTORY_KEY = "nas-history"
WEIGHTS_KEY = "nas-weights:"  # + candidate name


def memory_budget(run: RunContext) -> float | None:
    """Training-memory budget in bytes, None when ``fedkd-nas.memory-mb`` is 0 (no limit)."""
    megabytes = run.section(FedKDNASSettings).memory_mb
    return megabytes * BYTES_PER_MB if megabytes > 0 else None


@dataclass(frozen=True)
class Measured:
    """A candidate's hold-out accuracy and the training that produced it."""

    accuracy: float
    steps: int  # local training steps of the round it was measured in
    round: int  # that server round


@dataclass
class NasHistory:
    """What a client remembers about its candidates between rounds."""

    measured: dict[str, Measured] = field(default_factory=dict)  # last measurement per name
    incumbent: str = ""  # the current student ("" before the first round)
    rounds_trained: int = 0  # rounds this client has trained (the duel schedule counts them)
    kept: list[str] = field(default_factory=list)  # names with kept weights, least recent first

    @classmethod
    def load(cls, state: RecordDict) -> NasHistory:
        values = load_values(state, HISTORY_KEY)
        if values is None:
            return cls()
        columns = zip(
            values["names"], values["accuracy"], values["steps"], values["rounds"], strict=True
        )
        measured = {str(n): Measured(float(a), int(s), int(r)) for n, a, s, r in columns}
        return cls(
            measured, str(values["incumbent"]), int(values["rounds-trained"]), list(values["kept"])
        )

    def save(self, state: RecordDict) -> None:
        save_values(
            state,
            HISTORY_KEY,
            {
                "names": list(self.measured),
                "accuracy": [m.accuracy for m in self.measured.values()],
                "steps": [m.steps for m in self.measured.values()],
                "rounds": [m.round for m in self.measured.values()],
                "incumbent": self.incumbent,
                "rounds-trained": self.rounds_trained,
                "kept": self.kept,
            },
        )


@dataclass(frozen=True)
class Decision:
    """The outcome of a duel: who stays the student, both scores, and why."""

    winner: str
    score: float
    rival: str
    rival_score: float
    reason: str  # "duel-kept" or "duel-switched"


def feasible_candidates(run: RunContext, info: DatasetInfo, budget: float) -> list[Candidate]:
    """The run family's candidates this client can train; BudgetError when there is none."""
    candidates = run_candidates(run.family, info)
    fitting = affordable(candidates, budget, memory_budget(run))
    if not fitting:
        cheapest = candidates[0]
        raise BudgetError(
            f"budget {budget:,.0f} MACs (memory {run.section(FedKDNASSettings).memory_mb:g} MB) "
            f"affords no candidate of {run_family(run.family, info)}; the cheapest is "
            f"{cheapest.name} "
            f"({cheapest.macs:,} MACs, "
            f"{cheapest.train_memory_bytes / BYTES_PER_MB:.1f} MB)"
        )
    return fitting


def score(candidate: Candidate, accuracy: float, budget: float, lam: float) -> float:
    """Hold-out accuracy minus lambda * the share of the budget the candidate uses."""
    return accuracy - lam * candidate.macs / budget


def incumbent(feasible: Sequence[Candidate], history: NasHistory) -> tuple[Candidate, str]:
    """This round's student before any duel and why: the incumbent, or at the start (or should
    the incumbent no longer be feasible) the largest feasible candidate."""
    current = next((c for c in feasible if c.name == history.incumbent), None)
    if current is not None:
        return current, "incumbent"
    return max(feasible, key=lambda c: c.macs), "start"


def duel_due(history: NasHistory, feasible: Sequence[Candidate], duel_every: int) -> bool:
    """Whether the round about to be trained is a duel round (every ``duel_every``-th of this
    client's rounds; 0 never; never with a single feasible candidate)."""
    if duel_every == 0 or len(feasible) < 2:
        return False
    return (history.rounds_trained + 1) % duel_every == 0


def challenger(feasible: Sequence[Candidate], current: Candidate, history: NasHistory) -> Candidate:
    """The rival measured longest ago (never measured first; ties: the larger first), so every
    rival's measurement is refreshed in turn instead of going stale."""
    rivals = [c for c in feasible if c.name != current.name]
    never = -1

    def age(c: Candidate) -> tuple[int, int]:
        measured = history.measured.get(c.name)
        return (measured.round if measured else never, -c.macs)

    return min(rivals, key=age)


def required_gain(margin: float, holdout_size: int) -> float:
    """The score gain a challenger needs: the margin, but never less than one hold-out example."""
    return max(margin, 1.0 / holdout_size)


def decide(
    current: Candidate,
    current_result: Measured,
    rival: Candidate,
    rival_result: Measured,
    budget: float,
    lam: float,
    gain: float,
) -> Decision:
    """Incumbent against challenger after equal training; refuses scores from unequal training
    (different rounds or step counts), the mistake that locked the first controller in."""
    if (current_result.round, current_result.steps) != (rival_result.round, rival_result.steps):
        raise ValueError(
            f"{current.name} was measured after {current_result.steps} steps in round "
            f"{current_result.round}, {rival.name} after {rival_result.steps} in round "
            f"{rival_result.round}: a duel compares equal training only"
        )
    mine = score(current, current_result.accuracy, budget, lam)
    theirs = score(rival, rival_result.accuracy, budget, lam)
    if theirs > mine + gain:
        return Decision(rival.name, theirs, current.name, mine, "duel-switched")
    return Decision(current.name, mine, rival.name, theirs, "duel-kept")


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
    rng = stream_rng(seed, Stream.NAS_PRIVATE_HOLDOUT, partition_id)
    train, holdout = _seeded_split(len(shard.labels), fraction, rng)
    return (
        ImageArrays(shard.images[train], shard.labels[train]),
        ImageArrays(shard.images[holdout], shard.labels[holdout]),
    )


def public_holdout(size: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(public indices the clients distil on, public indices they score on): the same for every
    client and round, so all scores of a run are measured on one set; at least one each."""
    return _seeded_split(size, fraction, stream_rng(seed, Stream.NAS_PUBLIC_HOLDOUT))


def _seeded_split(
    size: int, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(kept indices, held-out indices), sorted: a ``fraction`` of ``range(size)`` drawn from
    ``rng``, at least one index on each side."""
    held = min(max(1, round(fraction * size)), size - 1)
    order = rng.permutation(size)
    return np.sort(order[held:]), np.sort(order[:held])

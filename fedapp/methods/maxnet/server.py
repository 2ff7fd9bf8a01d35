"""SuperFedNAS and DeepFedNAS transferred onto the FEAST model space.

Each sampled client trains ONE subnet of the FEAST supernet with plain cross-entropy and receives
only that subnet's leading slices. Who trains what follows the predecessors' tracking sandwich:
the sampled client with the fewest past MaxNet assignments trains the largest subnet, among the
rest the one with the fewest past MinNet assignments trains the smallest, everybody else a random
one. SuperFedNAS draws from the whole architecture space, DeepFedNAS along its cached Pareto path
(here: the variant cache). Replies merge by MaxNet aggregation: the max-subnet client's weight
decays from 0.9 to 0.125 over the first part of training, the others share the rest, and every
position is the weighted mean of the replies that cover it. Evaluation and accounting are FEAST's
(``CachedSupernetStrategy``), so the comparison with FEAST is like for like.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedapp.data.registry import ImageArrays
from fedapp.methods.common.aggregation import slice_mean
from fedapp.methods.common.reply_validation import ComputeFloor, ValidReply
from fedapp.methods.common.strategy import State
from fedapp.methods.common.supernet_server import CachedSupernetStrategy
from fedapp.methods.maxnet.keys import SUBNET
from fedapp.methods.maxnet.settings import MaxNetSettings
from fedapp.models.arch import Arch
from fedapp.models.counter import count, count_population
from fedapp.models.elastic_resnet import state_shapes
from fedapp.models.routing import affordable
from fedapp.models.slicing import extract
from fedapp.random_streams import Stream, stream_rng
from fedapp.run.context import RunContext
from fedapp.run.feast_space import ModelSpace
from fedapp.run.profiles import NodeProfile, NodeRegistry

#: MaxNet weight of the max-subnet client at round 0 and after the decay (authors' schedule
#: ``maxnet_cos_all_subnet`` with init 0.9, final 0.125).
MAXNET_INIT = 0.9
MAXNET_FINAL = 0.125
#: Roles of the tracking sandwich.
MAX, MIN, RANDOM = "max", "min", "random"
#: Random architectures drawn at once when a budget-constrained SuperFedNAS client needs one
#: within its budget; if none fits (tiny budgets), it draws from its affordable cached variants.
REJECTION_DRAWS = 4096
#: Random architectures the FEAST authors' SuperFedNAS transfer draws for a client's max subnet:
#: the one with the most MACs within the budget is kept.
TRANSFER_MAX_DRAWS = 20


def maxnet_weight(t: int, decay_rounds: float) -> float:
    """w_max(t) = 0.9 * ((1 - a) * 1/2 (1 + cos(pi min(t, S) / S)) + a), a = 0.125 / 0.9."""
    a = MAXNET_FINAL / MAXNET_INIT
    progress = min(t, decay_rounds) / decay_rounds
    return MAXNET_INIT * ((1 - a) * 0.5 * (1 + math.cos(math.pi * progress)) + a)


def maxnet_weights(
    roles: Sequence[str], examples: Sequence[float], w_max: float, by_examples: bool
) -> list[float]:
    """Aggregation weight of each accepted reply.

    The max-subnet client gets ``w_max``, each of the other K - 1 gets (1 - w_max) / (K - 1).
    Without a max-subnet reply (it was dropped) nobody trained the max subnet this round: the
    others get equal weights 1 / K, i.e. a plain overlap-aware average. ``by_examples`` then
    multiplies every weight by n_i / sum(n), as the authors' ``--weight_dataset``.
    """
    others = sum(role != MAX for role in roles)
    has_max = others < len(roles)
    other_weight = (1 - w_max) / others if has_max and others else 1 / max(others, 1)
    weights = [w_max if role == MAX else other_weight for role in roles]
    if by_examples:
        total = sum(examples)
        weights = [w * n / total for w, n in zip(weights, examples, strict=True)]
    return weights


class SandwichTracker:
    """Past MaxNet/MinNet assignments per partition id, which balance those roles over time."""

    def __init__(self) -> None:
        self.largest: dict[int, int] = {}
        self.smallest: dict[int, int] = {}

    def roles(self, partitions: Sequence[int]) -> dict[int, str]:
        """This cohort's roles (ties go to the lower partition id); counts the assignments."""
        order = sorted(partitions)
        roles = dict.fromkeys(order, RANDOM)
        if not order:
            return roles
        top = min(order, key=lambda p: (self.largest.get(p, 0), p))
        roles[top] = MAX
        self.largest[top] = self.largest.get(top, 0) + 1
        rest = [p for p in order if p != top]
        if rest:
            bottom = min(rest, key=lambda p: (self.smallest.get(p, 0), p))
            roles[bottom] = MIN
            self.smallest[bottom] = self.smallest.get(bottom, 0) + 1
        return roles


@dataclass(frozen=True)
class Assignment:
    """The subnet one client trains this round and the role it got it by."""

    role: str
    arch: Arch
    macs: int
    params: int


class PathSampler:
    """DeepFedNAS: subnets along the cached Pareto path (the variant cache), optionally only
    those within a budget (``budget=None``: the whole path)."""

    def __init__(self, space: ModelSpace) -> None:
        self.space = space
        self.config = space.config

    def _path(self, budget: float | None) -> list[int]:
        return (
            list(range(len(self.space.cache)))
            if budget is None
            else affordable(self.space.cache, budget)
        )

    def largest(self, budget: float | None) -> Arch:
        return self.space.cache.variants[self._path(budget)[-1]].arch

    def smallest(self, budget: float | None) -> Arch:
        return self.space.cache.variants[self._path(budget)[0]].arch

    def random(self, budget: float | None, rng: np.random.Generator) -> Arch:
        path = self._path(budget)
        return self.space.cache.variants[path[int(rng.integers(len(path)))]].arch

    def draw(self, role: str, budget: float | None, rng: np.random.Generator) -> Arch:
        if role == MAX:
            return self.largest(budget)
        if role == MIN:
            return self.smallest(budget)
        return self.random(budget, rng)


class SpaceSampler(PathSampler):
    """SuperFedNAS: uniformly random architectures of the whole space (each d, e, w gene drawn
    uniformly); the max and min subnets are the supernet's own. Under a budget the max and min
    are the client's largest and smallest affordable cached variants, and the random draw is
    uniform over the space's architectures within the budget (rejection sampling)."""

    def largest(self, budget: float | None) -> Arch:
        return self.config.max_arch() if budget is None else super().largest(budget)

    def smallest(self, budget: float | None) -> Arch:
        if budget is None:
            return self.config.arch_from_genes(np.zeros(self.config.num_genes, dtype=np.int64))
        return super().smallest(budget)

    def transfer(self, role: str, budget: float, rng: np.random.Generator) -> Arch:
        """The FEAST authors' transfer (``maxnet.subnet-sampling = "feast-transfer"``): min is the
        space's global minimum (every client's), max the best of 20 uniform random
        architectures within the budget (the most MACs; none fits: the global minimum), random
        as under ``budget-constrained``."""
        if role == MIN:
            return self.smallest(None)
        if role == MAX:
            genes = rng.integers(
                0, self.config.gene_high, size=(TRANSFER_MAX_DRAWS, self.config.num_genes)
            )
            macs, _ = count_population(self.config, genes)
            fits = np.flatnonzero(macs <= budget)
            if not fits.size:
                return self.smallest(None)
            return self.config.arch_from_genes(genes[fits[np.argmax(macs[fits])]])
        return self.random(budget, rng)

    def random(self, budget: float | None, rng: np.random.Generator) -> Arch:
        if budget is None:
            return self.config.arch_from_genes(rng.integers(0, self.config.gene_high))
        size = (REJECTION_DRAWS, self.config.num_genes)
        genes = rng.integers(0, self.config.gene_high, size=size)
        macs, _ = count_population(self.config.nominal(), genes)  # affordable as the cache
        fits = np.flatnonzero(macs <= budget)
        if fits.size:
            return self.config.arch_from_genes(genes[fits[0]])
        return super().random(budget, rng)


class MaxNetStrategy(CachedSupernetStrategy):
    """Single-subnet training with the tracking sandwich and MaxNet aggregation."""

    sampler_type: type[PathSampler] = PathSampler

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.settings = run.section(MaxNetSettings)
        self.sampler = self.sampler_type(self.space)
        self.tracker = SandwichTracker()
        #: partition id -> this round's assignment
        self.assigned: dict[int, Assignment] = {}

    @property
    def weight_examples(self) -> bool:
        """Whether MaxNet weights are multiplied by n_i / sum(n) (the FEAST transfer always)."""
        return self.settings.weight_examples or self.settings.subnet_sampling == "feast-transfer"

    def points_trained(self, profile: NodeProfile) -> list[int]:
        """The cached variant the node's subnet is, if it is one."""
        arch = self.assigned[profile.partition_id].arch
        return [i for i, v in enumerate(self.space.cache.variants) if v.arch == arch]

    @property
    def decay_rounds(self) -> float:
        """S: rounds over which the MaxNet weight decays."""
        return self.settings.decay_fraction * self.run.rounds.num_server_rounds

    # ---- who trains what ------------------------------------------------------------------------
    def sample_cohort(self, server_round: int, grid: Grid) -> list[NodeProfile]:
        """The base's seeded cohort, each member assigned its subnet for the round."""
        cohort = super().sample_cohort(server_round, grid)
        roles = self.tracker.roles([p.partition_id for p in cohort])
        self.assigned = {
            p.partition_id: self.assign(server_round, p, roles[p.partition_id]) for p in cohort
        }
        return cohort

    def assign(self, server_round: int, profile: NodeProfile, role: str) -> Assignment:
        """The subnet of a role; random draws from the (round, partition id) subnet stream."""
        rng = stream_rng(
            self.run.rounds.seed, Stream.MAXNET_SUBNETS, server_round, profile.partition_id
        )
        if self.settings.subnet_sampling == "feast-transfer":
            arch = self.sampler.transfer(role, profile.budget, rng)  # SpaceSampler (config check)
        else:
            budget = None if self.settings.subnet_sampling == "unconstrained" else profile.budget
            arch = self.sampler.draw(role, budget, rng)
        arch = self.space.config.validate(arch)
        cost = count(self.space.config, arch)
        return Assignment(role, arch, cost.macs, cost.params)

    # ---- one round ------------------------------------------------------------------------------
    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        arch = self.assigned[profile.partition_id].arch
        return extract(global_state, state_shapes(self.space.config, arch))

    def payload_params(self, profile: NodeProfile, payload: State) -> int:
        return self.assigned[profile.partition_id].params

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """Local epochs of the node's assigned subnet."""
        return self.training_floor(self.assigned[profile.partition_id].macs)

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        assignment = self.assigned[profile.partition_id]
        return super().train_config(server_round, profile) | {
            SUBNET: str(assignment.arch),
            "role": assignment.role,
        }

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        partitions = [self.nodes.profiles[r.node_id].partition_id for r in replies]
        weights = maxnet_weights(
            [self.assigned[pid].role for pid in partitions],
            [r.weight for r in replies],
            maxnet_weight(server_round - 1, self.decay_rounds),
            self.weight_examples,
        )
        return slice_mean(global_state, replies, weights)

    # ---- resume and final report ----------------------------------------------------------------
    def accounts(self) -> dict[str, Any]:
        """The base's records and the sandwich's role counts (they decide later roles)."""
        return super().accounts() | {
            "maxnet_assignments": dict(self.tracker.largest),
            "minnet_assignments": dict(self.tracker.smallest),
        }

    def restore_accounts(self, accounts: dict[str, Any]) -> None:
        super().restore_accounts(accounts)
        self.tracker.largest = {int(k): int(v) for k, v in accounts["maxnet_assignments"].items()}
        self.tracker.smallest = {int(k): int(v) for k, v in accounts["minnet_assignments"].items()}

    def test_report(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        summary = self.served_report(state, data, run_dir) | {
            "subnet_sampling": self.settings.subnet_sampling,
            "maxnet_weight_examples": self.weight_examples,
            "maxnet_assignments": {str(k): v for k, v in sorted(self.tracker.largest.items())},
            "minnet_assignments": {str(k): v for k, v in sorted(self.tracker.smallest.items())},
        }
        self.log_report(summary, self.communication(state))
        log(
            INFO,
            "training compute proxy: %.3f TMACs; MaxNet assignments per partition %s",
            self.accounting.compute_total() / 1e12,
            summary["maxnet_assignments"],
        )
        return summary

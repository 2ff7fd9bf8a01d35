"""Which nodes train in a round: the connected, profiled nodes a method can use and the fleet
says are reachable, in partition order, and a seeded draw among them
(``fedapp.partitions.cohorts``), larger where the round policy over-commits. A node that joins
late is profiled when first seen; one the method cannot use is logged once, with the method's
reason."""

from __future__ import annotations

from collections.abc import Callable
from logging import ERROR, WARNING

from flwr.common.logger import log
from flwr.serverapp import Grid

from fedapp.partitions.cohorts import cohort_indices
from fedapp.run.fleet import RunFleet
from fedapp.run.pieces import RoundPlan
from fedapp.run.profiles import NodeProfile, NodeRegistry


class CohortSampler:
    """Seeded cohorts over the nodes that ``ineligibility`` (a method's) lets take part."""

    def __init__(
        self,
        method: str,
        rounds: RoundPlan,
        nodes: NodeRegistry,
        fleet: RunFleet,
        ineligibility: Callable[[NodeProfile], str | None],
    ) -> None:
        self.method, self.rounds = method, rounds
        self.nodes = nodes
        self.fleet = fleet
        self.ineligibility = ineligibility
        self._left_out: set[int] = set()  # nodes already logged as unable to take part

    def eligible(self, profile: NodeProfile) -> bool:
        """Whether a node can take part; one that cannot is logged once with the reason."""
        reason = self.ineligibility(profile)
        if reason is not None and profile.node_id not in self._left_out:
            self._left_out.add(profile.node_id)
            log(
                ERROR,
                "%s: node %s (partition %d) left out: %s",
                self.method,
                profile.node_id,
                profile.partition_id,
                reason,
            )
        return reason is None

    def sample(self, server_round: int, grid: Grid) -> list[NodeProfile]:
        """Seeded draw of this round's clients among the connected, profiled, eligible nodes
        that the fleet says are reachable."""
        connected = list(grid.get_node_ids())
        self.nodes.discover(grid, connected, self.rounds.round_timeout)
        candidates = sorted(
            (
                self.nodes.profiles[n]
                for n in connected
                if n in self.nodes.profiles
                and self.eligible(self.nodes.profiles[n])
                and self.fleet.available(server_round, self.nodes.profiles[n].partition_id)
            ),
            key=lambda p: p.partition_id,
        )
        wanted = self.fleet.sample_size(self.rounds.cohort_size)
        size = min(wanted, len(candidates))
        if size < wanted:
            log(
                WARNING,
                "round %d: only %d nodes available for a cohort of %d",
                server_round,
                size,
                wanted,
            )
        chosen = cohort_indices(
            self.rounds.cohort_rng, self.rounds.seed, server_round, len(candidates), size
        )
        return [candidates[i] for i in chosen]

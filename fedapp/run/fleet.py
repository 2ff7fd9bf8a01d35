"""The run's fleet: which device class each client is, whether it is reachable in a round, and
how long its client-rounds and the server's rounds last (fedapp.evaluation.fleet_clock)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from fedapp.evaluation.fleet_clock import DeviceClass, RoundTime, time_round
from fedapp.evaluation.fleet_time import FLEET_CLIENTS, FLEET_SECONDS
from fedapp.evaluation.fleets import Fleet, FleetFileError, load_fleet
from fedapp.run.config import ConfigError
from fedapp.run.federated_data import client_budgets
from fedapp.run.pieces import BudgetDraw, FleetSection


class RunFleet:
    """The fleet ``spec`` names, its classes assigned to the run's clients by the budgets of
    ``budgets`` (the seeded draw every node's budget comes from in simulation)."""

    def __init__(self, spec: FleetSection, budgets: BudgetDraw, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        try:
            self.fleet: Fleet = load_fleet(spec.file)
            self.devices: tuple[DeviceClass, ...] = self.fleet.assign(client_budgets(budgets))
        except FleetFileError as err:
            raise ConfigError(f"run config 'fleet.file' = {spec.file!r}: {err}") from None

    @property
    def virtual(self) -> bool:
        """Whether rounds are timed by the fleet's clock (else by the wall clock: deployment)."""
        return self.spec.clock == "virtual"

    def device(self, partition: int) -> DeviceClass:
        """A client's device class (a partition beyond the run's clients has none: a node that
        reports one is refused by its handshake first)."""
        return self.devices[partition]

    def available(self, server_round: int, partition: int) -> bool:
        """Whether a client is reachable in a round (always, under the wall clock: the real
        nodes say so by connecting)."""
        if not self.virtual:
            return True
        return self.fleet.available(self.device(partition), self.seed, server_round, partition)

    def sample_size(self, cohort: int) -> int:
        """Clients sampled for a cohort of ``cohort``: over-commit samples more."""
        if self.spec.policy == "over-commit":
            return math.ceil(self.spec.over_commit * cohort - 1e-9)
        return cohort

    def client_seconds(
        self, partition: int, bytes_down: float, macs: float, bytes_up: float
    ) -> float:
        """One client-round's fleet seconds on the client's device."""
        return self.device(partition).client_round_seconds(bytes_down, macs, bytes_up)

    def time_round(self, seconds_by_node: Mapping[int, float], cohort: int) -> RoundTime:
        """Which replies the round's policy keeps, and how long its client phase lasts."""
        return time_round(seconds_by_node, self.spec.policy, self.spec.deadline, cohort)

    def summary(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """summary.json's ``fleet``: the fleet and policy, the run's length on it (its rounds'
        ``fleet-seconds``; ``client_seconds``: their client phases alone, which leave out the
        server's measured work), the replies its policy dropped and the clients of each class."""
        seconds = float(sum(float(r.get(FLEET_SECONDS, 0.0)) for r in rows))
        return {
            "file": self.spec.file,
            "policy": self.spec.policy,
            "deadline": self.spec.deadline,
            "over_commit": self.spec.over_commit,
            "clock": self.spec.clock,
            "seconds": seconds,
            "hours": seconds / 3600.0,
            "client_seconds": float(sum(float(r.get(FLEET_CLIENTS, 0.0)) for r in rows)),
            "clients_late": int(sum(r.get("clients-late", 0) for r in rows)),
            "clients_surplus": int(sum(r.get("clients-surplus", 0) for r in rows)),
            "clients_by_class": dict(Counter(d.name for d in self.devices)),
        }

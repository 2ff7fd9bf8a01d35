"""The settings of Flower's strategies, one section each (``flwr-<name>.*``), named as Flower's
constructor arguments; their defaults in pyproject.toml are Flower's own.

Left out: the arguments that fedapp's round engine decides instead (sampling, weighting, record
keys), FedOpt's ``eta_l`` (Flower only logs it: the clients train at the run's
``learning-rate``) and QFedAvg's ``client_learning_rate`` (the round's learning rate, the one its
clients used)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedapp.run.pieces import cohort_size
from fedapp.sections import Section, at_least, fraction, positive, setting


@dataclass(frozen=True)
class FedAvgMSettings(Section):
    name = "flwr-fedavgm"

    server_learning_rate: float = setting(positive())
    server_momentum: float = setting(fraction(False, 1, True))


@dataclass(frozen=True)
class FedAdagradSettings(Section):
    name = "flwr-fedadagrad"

    #: Server learning rate.
    eta: float = setting(positive())
    #: How adaptive the step is: added to the root of the second moment.
    tau: float = setting(positive())


@dataclass(frozen=True)
class FedAdamSettings(FedAdagradSettings):
    name = "flwr-fedadam"

    #: Decay of the first and of the second moment.
    beta_1: float = setting(fraction(False, 1, True))
    beta_2: float = setting(fraction(False, 1, True))


@dataclass(frozen=True)
class FedYogiSettings(FedAdamSettings):
    name = "flwr-fedyogi"


@dataclass(frozen=True)
class FedProxSettings(Section):
    name = "flwr-fedprox"

    #: Weight of the clients' proximal term mu / 2 * ||w - w_global||^2 (0: FedAvg).
    proximal_mu: float = setting(at_least(0))


@dataclass(frozen=True)
class FedTrimmedAvgSettings(Section):
    name = "flwr-fedtrimmedavg"

    #: Share of the replies cut at each end of every coordinate before the mean.
    beta: float = setting(fraction(False, 0.5, True))


@dataclass(frozen=True)
class KrumSettings(Section):
    name = "flwr-krum"

    #: How many Byzantine replies a round is assumed to hold.
    num_malicious_nodes: int = setting(at_least(0))


@dataclass(frozen=True)
class MultiKrumSettings(KrumSettings):
    name = "flwr-multikrum"

    #: How many of the best-scored replies are averaged.
    num_nodes_to_select: int = setting(at_least(1))


@dataclass(frozen=True)
class BulyanSettings(KrumSettings):
    name = "flwr-bulyan"

    def cross_checks(self, strategy: str, run: Mapping[str, Any]) -> list[str]:
        needed = 4 * self.num_malicious_nodes + 3
        cohort = cohort_size(run["min-train-clients"], run["fraction-train"], run["num-clients"])
        if cohort < needed:
            return [
                f"strategy {strategy!r} needs at least 4 * 'flwr-bulyan.num-malicious-nodes' + 3 "
                f"= {needed} replies a round, but the cohort is {cohort} clients (num-clients "
                f"{run['num-clients']}, fraction-train {run['fraction-train']:g}, "
                f"min-train-clients {run['min-train-clients']})"
            ]
        return []


@dataclass(frozen=True)
class QFedAvgSettings(Section):
    name = "flwr-qfedavg"

    #: Fairness exponent q (0: FedAvg-like weighting; larger favours the clients with high loss).
    q: float = setting(at_least(0))

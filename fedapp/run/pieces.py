"""The pieces of a run's context: each a frozen set of the run-config keys that shape one shared
thing, named as the config names them (fedapp.run.context fills them from the config by field
name). A function given a piece can read nothing else, so a cache keyed on it is keyed on exactly
what it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedapp.evaluation.fleet_clock import CLOCKS, POLICIES
from fedapp.evaluation.fleets import FleetFileError, is_fleet_name, load_fleet
from fedapp.models.arch import CACHES_DIR, SUPERNETS_DIR, yaml_names
from fedapp.models.families import FAMILY_NAMES
from fedapp.sections import Section, at_least, one_of, setting


@dataclass(frozen=True)
class DataSource:
    """Where the run's data set comes from: its name and, for file-backed sets, its path."""

    dataset: str
    data_dir: str


@dataclass(frozen=True)
class BudgetDraw:
    """Every client's compute budget (MACs): a seeded Zipf draw over ``budget_min`` to
    ``budget_max``, each raised to ``budget_floor`` (as the FEAST authors' server raises those
    below its cache's smallest variant: their draw starts at the CSV's 10-class minimum, just
    below the recount)."""

    num_clients: int
    budget_min: float
    budget_max: float
    zipf_s: float
    seed: int
    budget_rng: str
    budget_floor: float


@dataclass(frozen=True)
class DataLayout:
    """Everything that decides who holds which examples, and nothing else: server and clients
    cut the same splits from it, and fedapp.run.federated_data's caches (a device's shard files
    included) are keyed on it, so a key that shapes the split cannot be left out of their key."""

    source: DataSource
    seed: int
    num_clients: int
    partitioner: str
    dirichlet_alpha: float
    shards_per_client: int
    calibration_size: int
    validation_size: int
    public_size: int
    test_size: int
    client_pool_size: int
    gamma: float
    allocation_cap: float
    budgets: BudgetDraw


@dataclass(frozen=True)
class FeastSpaceSection(Section):
    """``feast-space.*``: the FEAST model space that FEAST and the SuperFedNAS/DeepFedNAS
    transfers train."""

    name = "feast-space"

    supernet: str = setting(one_of(lambda: yaml_names(SUPERNETS_DIR)))
    variant_cache: str = setting(one_of(lambda: yaml_names(CACHES_DIR)))
    anchor_variants: str = setting(
        (
            lambda v: v == "" or all(p.strip().isdigit() for p in v.split(",")),
            "empty (5 evenly spaced variants) or comma-separated cache indices like '0,3,9'",
        )
    )


@dataclass(frozen=True)
class SubstrateSection(Section):
    """``substrate.*``: the ResNet18 layout that HeteroFL, ScaleFL and FIARSE scale."""

    name = "substrate"

    supernet: str = setting(one_of(lambda: yaml_names(SUPERNETS_DIR)))


@dataclass(frozen=True)
class CandidatesSection(Section):
    """``candidates.*``: the model family the logit-exchange methods (FedKD-NAS, Local-KD,
    FedMD, FedDistill) and FedDF choose their candidates from."""

    name = "candidates"

    family: str = setting(one_of(("auto", *FAMILY_NAMES)))


@dataclass(frozen=True)
class FleetSection(Section):
    """``fleet.*``: the fleet every method's rounds are timed on (fedapp.evaluation.fleet_clock)
    and the round policy that decides which replies a round waits for."""

    name = "fleet"

    file: str = setting()  # a fleet in conf/fleets by name, or a fleet file's path
    policy: str = setting(one_of(POLICIES))
    deadline: float = setting(at_least(0))
    over_commit: float = setting(at_least(1))
    clock: str = setting(one_of(CLOCKS))

    def cross_checks(self, strategy: str, run: Mapping[str, Any]) -> list[str]:
        problems = []
        if is_fleet_name(self.file):  # a path is the server's: it reads it when it starts
            try:
                load_fleet(self.file)
            except FleetFileError as err:
                problems.append(f"'fleet.file' = {self.file!r}: {err}")
        if self.policy == "deadline" and self.deadline <= 0:
            problems.append(
                "'fleet.policy' = 'deadline' needs 'fleet.deadline' > 0 (fleet seconds a round "
                "waits for replies)"
            )
        if self.clock == "wall" and self.policy != "wait-for-all":
            problems.append(
                f"'fleet.clock' = 'wall' times the real rounds, which wait for every reply "
                f"(round-timeout bounds them): 'fleet.policy' = {self.policy!r} needs "
                "'fleet.clock' = 'virtual'"
            )
        return problems


#: The sections several methods share, parsed for every run like the methods' own.
SHARED_SECTIONS: tuple[type[Section], ...] = (
    FeastSpaceSection,
    SubstrateSection,
    CandidatesSection,
    FleetSection,
)


@dataclass(frozen=True)
class FeastSpaceSpec:
    """What chooses and checks the FEAST model space: the supernet, its cache, the anchors
    validated each evaluation round (``feast-space.*``), and the lowest budget it must afford."""

    supernet: str
    variant_cache: str
    anchor_variants: str
    budget_min: float
    budget_floor: float


@dataclass(frozen=True)
class CandidateFamily:
    """What chooses the logit-exchange methods' candidates (``candidates.family``)."""

    family: str
    dataset: str
    batch_size: int  # a candidate's memory is counted at the run's batch size


@dataclass(frozen=True)
class LocalTraining:
    """The run's local-training settings: what every trainer's set-up and epochs read."""

    seed: int  # with the round and the partition id, it seeds the node's work
    local_epochs: int
    batch_size: int
    momentum: float
    weight_decay: float
    device: str
    grad_clip: float
    mix_batches: bool


@dataclass(frozen=True)
class RoundPlan:
    """What the server's rounds follow: their number, the seeded cohorts, the wait for replies,
    the cap on one node's aggregation weight, the learning-rate schedule and the validation
    cadence."""

    num_server_rounds: int
    num_clients: int
    fraction_train: float
    min_train_clients: int
    cohort_rng: str
    seed: int
    round_timeout: float
    max_weight_share: float
    learning_rate: float
    lr_schedule: str
    eval_every: int  # validation every this many rounds, and after the last

    @property
    def cohort_size(self) -> int:
        """Clients sampled per round: Flower's rule, max(min-train, fraction of the population)."""
        return cohort_size(self.min_train_clients, self.fraction_train, self.num_clients)


def cohort_size(min_train_clients: int, fraction_train: float, num_clients: int) -> int:
    """Flower's cohort rule: max(min-train-clients, fraction-train x num-clients, floored)."""
    return max(min_train_clients, int(fraction_train * num_clients))

"""The pieces of a run's context: each a frozen set of the run-config keys that shape one shared
thing, named as the config names them (fedapp.run.context fills them from the config by field
name). A function given a piece can read nothing else, so a cache keyed on it is keyed on exactly
what it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.models.arch import CACHES_DIR, SUPERNETS_DIR, yaml_names
from fedapp.models.families import FAMILY_NAMES
from fedapp.sections import Section, one_of, setting


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


#: The sections several methods share, parsed for every run like the methods' own.
SHARED_SECTIONS: tuple[type[Section], ...] = (
    FeastSpaceSection,
    SubstrateSection,
    CandidatesSection,
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

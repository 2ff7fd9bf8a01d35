"""What a run shares, built once per process from its config (:func:`run_context`).

Each piece is a frozen dataclass of only the run-config keys that shape it, filled from the config
by field name (:func:`piece`). A function given a piece cannot read any other key, so a cache
keyed on a piece is keyed on exactly what it reads, with no list of keys to keep by hand. Both
halves of a method receive the context (their own settings in it); the whole config stays with the
apps, which parse it, place the run's files and resume runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Any, TypeVar

from fedapp.data.registry import DatasetInfo
from fedapp.method_table import settings_class
from fedapp.run.config import RunConfig
from fedapp.run.federated_data import dataset_info
from fedapp.run.pieces import (
    BudgetDraw,
    CandidateFamily,
    CandidatesSection,
    DataLayout,
    DataSource,
    FeastSpaceSection,
    FeastSpaceSpec,
    FleetSection,
    LocalTraining,
    RoundPlan,
    SubstrateSection,
)
from fedapp.sections import Section

P = TypeVar("P")
S = TypeVar("S", bound=Section)


@dataclass(frozen=True)
class RunContext:
    """The run as a method sees it: the rounds' plan, the data layout, local training, the model
    spaces the methods build from, and the running method's own settings."""

    strategy: str
    rounds: RoundPlan  # the server's schedule (ScaleFL's clients also time their KD by it)
    data: DataLayout
    training: LocalTraining
    feast_space: FeastSpaceSpec  # FEAST and the SuperFedNAS/DeepFedNAS transfers
    family: CandidateFamily  # the logit-exchange methods' candidates
    substrate: str  # the ResNet18 substrate of HeteroFL, ScaleFL and FIARSE
    model: str  # the whole model of FedAvg, Ditto and FedDF's prototypes
    fleet: FleetSection  # the fleet every method's rounds are timed on, and the round policy
    settings: Section | None

    @property
    def info(self) -> DatasetInfo:
        """The data set's facts (those the server sent, where a node adopted them)."""
        return dataset_info(self.data.source)

    def section(self, kind: type[S]) -> S:
        """The running method's settings, as the method's own section class."""
        if type(self.settings) is not kind:
            raise LookupError(f"strategy {self.strategy!r} does not read the section {kind.name!r}")
        return self.settings


def piece(kind: type[P], cfg: RunConfig, **given: Any) -> P:
    """A piece filled from the run config by its field names (``given`` for the others: nested
    pieces, and values read from a section)."""
    return kind(
        **{f.name: getattr(cfg, f.name) for f in fields(kind) if f.name not in given}, **given
    )


@lru_cache(maxsize=4)
def run_context(cfg: RunConfig) -> RunContext:
    """The run's context, once per config and process."""
    kind = settings_class(cfg.strategy)
    return RunContext(
        strategy=cfg.strategy,
        rounds=piece(RoundPlan, cfg),
        data=data_layout(cfg),
        training=piece(LocalTraining, cfg),
        feast_space=piece(FeastSpaceSpec, cfg, **asdict(cfg.section(FeastSpaceSection))),
        family=piece(CandidateFamily, cfg, family=cfg.section(CandidatesSection).family),
        substrate=cfg.section(SubstrateSection).supernet,
        model=cfg.model,
        fleet=cfg.section(FleetSection),
        settings=None if kind is None else cfg.section(kind),
    )


@lru_cache(maxsize=4)
def data_layout(cfg: RunConfig) -> DataLayout:
    """The run's data layout (the budget draw inside it)."""
    return piece(DataLayout, cfg, source=piece(DataSource, cfg), budgets=piece(BudgetDraw, cfg))

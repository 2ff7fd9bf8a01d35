"""One typed run configuration, validated once at start on the server and on every client.

Defaults live in exactly one place, ``[tool.flwr.app.config]`` of ``pyproject.toml``, which Flower
fuses with ``--run-config`` overrides; this module only types and checks what arrives. Run-wide keys
are fields of :class:`RunConfig`; the keys one method reads are its section (``settings.py`` of its
folder, named by its row of the method table), spelled ``<section>.<key>``; the keys of a model
space several methods share are a shared section (``feast-space``, ``substrate``, ``candidates``, in
fedapp.run.pieces). A user error becomes a :class:`ConfigError` whose message names the key, the
value given and what is allowed, so the apps can stop before any training without a traceback.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from flwr.common.config import flatten_dict, get_fused_config_from_dir

from fedapp.data.registry import DATASET_NAMES
from fedapp.method_table import METHODS, settings_class, settings_classes
from fedapp.models.zoo import model_names
from fedapp.partitions.budgets import RNG_KINDS
from fedapp.partitions.factory import PARTITIONER_NAMES
from fedapp.run.pieces import SHARED_SECTIONS, cohort_size
from fedapp.sections import (
    Section,
    at_least,
    check_of,
    fraction,
    is_protocol,
    key_of,
    one_of,
    positive,
    setting,
)

DEVICES = ("auto", "cpu", "cuda")
LR_SCHEDULES = ("constant", "cosine")


class ConfigError(ValueError):
    """A run-config value that cannot be used; the message is meant for the user as it is."""


@dataclass(frozen=True)
class RunConfig:
    """Every run-wide key, typed (field ``foo_bar`` is key ``foo-bar``), and each method's
    settings section (:meth:`section`)."""

    # the federation
    strategy: str = setting(one_of(lambda: tuple(METHODS)))
    seed: int = setting(protocol=True)
    num_server_rounds: int = setting(at_least(1), protocol=True)
    num_clients: int = setting(at_least(1), protocol=True)
    fraction_train: float = setting(fraction(True, 1, False), protocol=True)
    min_train_clients: int = setting(at_least(1), protocol=True)
    round_timeout: float = setting(positive())
    node_wait_timeout: float = setting(positive())
    #: The most of a round's aggregation weight one node's reply may carry (1: no cap): a
    #: node's examples are its own word, so a cap bounds what one node can claim.
    max_weight_share: float = setting(fraction(True, 1, False), protocol=True)
    # data and its split between server and clients
    dataset: str = setting(one_of(DATASET_NAMES), protocol=True)
    data_dir: str = setting(protocol=True)
    partitioner: str = setting(one_of(PARTITIONER_NAMES), protocol=True)
    dirichlet_alpha: float = setting(positive(), protocol=True)
    shards_per_client: int = setting(at_least(1), protocol=True)
    calibration_size: int = setting(at_least(0), protocol=True)
    validation_size: int = setting(at_least(1), protocol=True)
    public_size: int = setting(at_least(0), protocol=True)
    test_size: int = setting(at_least(1), protocol=True)
    client_pool_size: int = setting(at_least(0), protocol=True)
    # compute budgets (MACs) and their link to data shares
    budget_min: float = setting(positive(), protocol=True)
    budget_max: float = setting(positive(), protocol=True)
    zipf_s: float = setting(at_least(0), protocol=True)
    budget_rng: str = setting(one_of(RNG_KINDS), protocol=True)
    #: Every drawn budget is raised to at least this many MACs (0: none); a method that cannot
    #: serve a budget below its smallest model refuses a run whose budgets could fall below it.
    budget_floor: float = setting(at_least(0), protocol=True)
    cohort_rng: str = setting(one_of(RNG_KINDS), protocol=True)
    gamma: float = setting(at_least(0), protocol=True)
    allocation_cap: float = setting(positive(), protocol=True)
    # local training
    model: str = setting(one_of(model_names))
    local_epochs: int = setting(at_least(1))
    batch_size: int = setting(at_least(1))
    learning_rate: float = setting(positive())
    momentum: float = setting(fraction(False, 1, True))
    weight_decay: float = setting(at_least(0))
    lr_schedule: str = setting(one_of(LR_SCHEDULES))
    device: str = setting(one_of(DEVICES), protocol=True)
    client_threads: int = setting(at_least(0))
    grad_clip: float = setting(positive())
    mix_batches: bool = setting(protocol=True)
    # evaluation and outputs
    eval_every: int = setting(at_least(1), protocol=True)
    out_dir: str = setting()
    run_name: str = setting(
        (
            lambda v: v == "" or _inside(PurePosixPath(v)),
            "a relative path inside out-dir without '..' (like 'fedavg-iid' or 'feast/run'), "
            "or empty for a time-stamped name",
        )
    )
    resume: bool = setting()
    tensorboard: bool = setting()  # TensorBoard event files beside the run's files (server only)
    #: The shared sections (the model spaces), then every method's, in method-table order.
    sections: tuple[Section, ...] = field(default=(), metadata={"section": True})

    @property
    def cohort_size(self) -> int:
        """Clients sampled per round: Flower's rule, max(min-train, fraction of the population)."""
        return cohort_size(self.min_train_clients, self.fraction_train, self.num_clients)

    def section(self, kind: type[S]) -> S:
        """The run's values of one method's settings (``cfg.section(FiarseSettings)``)."""
        for section in self.sections:
            if type(section) is kind:
                return section
        raise LookupError(f"no run-config section is the section {kind.name!r}")

    def resolved_out_dir(self) -> Path:
        """Absolute output folder: ``out-dir`` (``~`` expanded) or ``~/fedapp-runs`` if empty."""
        base = Path(os.path.expanduser(self.out_dir or "~/fedapp-runs"))
        return base.resolve()

    def as_run_config(self) -> dict[str, Any]:
        """The configuration back in Flower's form: kebab-case keys, dotted for sections."""
        flat = {key_of(f.name): getattr(self, f.name) for f in run_fields()}
        for section in self.sections:
            flat |= {
                f"{section.name}.{key_of(f.name)}": getattr(section, f.name)
                for f in fields(section)
            }
        return flat

    def as_saved_config(self) -> dict[str, Any]:
        """What the run's folder keeps (config.json): :meth:`as_run_config` without the sections
        only other methods read, which never shape this run."""
        foreign = foreign_keys(self.strategy)
        return {k: v for k, v in self.as_run_config().items() if k not in foreign}


S = TypeVar("S", bound=Section)


def _inside(path: PurePosixPath) -> bool:
    """Whether ``<out-dir>/<path>`` is a folder below out-dir: a run never writes outside it."""
    return bool(path.parts) and not path.is_absolute() and ".." not in path.parts


def run_fields() -> tuple[Field, ...]:
    """The run-wide fields of RunConfig (its sections aside)."""
    return tuple(f for f in fields(RunConfig) if not f.metadata.get("section"))


def protocol_keys() -> frozenset[str]:
    """Run-wide keys that define the experiment every method of a comparison must share."""
    return frozenset(key_of(f.name) for f in run_fields() if is_protocol(f))


def _coerce(key: str, value: Any, kind: type) -> Any:
    """Convert a TOML value to the field's type, refusing anything lossy or non-finite."""
    ok = (
        (kind is bool and isinstance(value, bool))
        or (kind is str and isinstance(value, str))
        or (kind is int and isinstance(value, int) and not isinstance(value, bool))
        or (kind is float and isinstance(value, int | float) and not isinstance(value, bool))
    )
    if not ok:
        raise ConfigError(
            f"run config '{key}' = {value!r}: expected a {kind.__name__}, "
            f"got {type(value).__name__}"
        )
    if kind is float:
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"run config '{key}' = {value!r}: must be a finite number")
    return value


_TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def _parse_fields(
    declared: tuple[Field, ...], prefix: str, run_config: Mapping[str, Any], problems: list[str]
) -> dict[str, Any]:
    """Field name -> typed, checked value of ``prefix + key`` for each declared field; what is
    missing or not allowed goes to ``problems``."""
    values = {}
    for f in declared:
        key = prefix + key_of(f.name)
        if key not in run_config:
            problems.append(
                f"run config key '{key}' is missing (every key has a default in "
                "[tool.flwr.app.config] of pyproject.toml)"
            )
            continue
        try:
            value = _coerce(key, run_config[key], _TYPES[f.type])
        except ConfigError as err:
            problems.append(str(err))
            continue
        check = check_of(f)
        if check is not None and not check[0](value):
            allowed = check[1]() if callable(check[1]) else check[1]
            problems.append(f"run config '{key}' = {value!r} is not allowed: must be {allowed}")
            continue
        values[f.name] = value
    return values


def _unknown_keys(run_config: Mapping[str, Any], known: set[str]) -> list[str]:
    """A message for each key no field reads."""
    return [
        f"run config key '{key}' is unknown: pyproject.toml lists every key"
        for key in sorted(set(run_config) - known)
    ]


def _cross_checks(cfg: RunConfig) -> list[str]:
    """Constraints between run-wide keys, then those of the running method's section."""
    problems = []
    if cfg.budget_min > cfg.budget_max:
        problems.append(
            f"'budget-min' = {cfg.budget_min:g} is above 'budget-max' = {cfg.budget_max:g}: "
            "the budget range needs budget-min <= budget-max"
        )
    if cfg.min_train_clients > cfg.num_clients:
        problems.append(
            f"'min-train-clients' = {cfg.min_train_clients} asks for more clients per round than "
            f"'num-clients' = {cfg.num_clients}: allowed is 1 to num-clients"
        )
    run = {key_of(f.name): getattr(cfg, f.name) for f in run_fields()}
    if METHODS[cfg.strategy].needs_public_set and cfg.public_size < 1:
        problems.append(
            f"strategy {cfg.strategy!r} distils on a public set, but 'public-size' = "
            f"{cfg.public_size}: set it to the number of server-held public images (e.g. 500)"
        )
    elif (kind := settings_class(cfg.strategy)) is not None:
        problems += cfg.section(kind).cross_checks(cfg.strategy, run)
    for shared in SHARED_SECTIONS:
        problems += cfg.section(shared).cross_checks(cfg.strategy, run)
    if cfg.resume and not cfg.run_name:
        problems.append(
            "'resume' = true needs 'run-name': the run to continue is <out-dir>/<run-name>"
        )
    return problems


def parse_run_config(run_config: Mapping[str, Any]) -> RunConfig:
    """Type and validate Flower's run config; raises ConfigError listing every problem found."""
    problems: list[str] = []
    values = _parse_fields(run_fields(), "", run_config, problems)
    known = {key_of(f.name) for f in run_fields()}
    sections = []
    for kind in (*SHARED_SECTIONS, *settings_classes()):
        declared = fields(kind)
        parsed = _parse_fields(declared, f"{kind.name}.", run_config, problems)
        known |= {f"{kind.name}.{key_of(f.name)}" for f in declared}
        if len(parsed) == len(declared):
            sections.append(kind(**parsed))
    problems += _unknown_keys(run_config, known)
    if not problems:
        cfg = RunConfig(**values, sections=tuple(sections))
        problems = _cross_checks(cfg)
        if not problems:
            return cfg
    raise ConfigError("invalid run configuration:\n  - " + "\n  - ".join(problems))


#: The app's folder (its pyproject.toml holds every key's default), for the tools that run or read
#: its runs from outside Flower.
APP_DIR = Path(__file__).resolve().parents[2]


def fused_run_config(app_dir: Path, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The app's defaults (``[tool.flwr.app.config]``) with ``overrides`` applied, as Flower
    fuses them; nested tables become dotted keys. A key the app does not declare is a
    ConfigError, with every such key named at once."""
    flat = flatten_dict(dict(overrides))
    problems = _unknown_keys(flat, set(get_fused_config_from_dir(app_dir, {})))
    if problems:
        raise ConfigError("invalid run configuration:\n  - " + "\n  - ".join(problems))
    return get_fused_config_from_dir(app_dir, flat)


def replace(cfg: RunConfig, **changes: Any) -> RunConfig:
    """A validated copy with some run-wide fields changed (used by tests and tools)."""
    merged = cfg.as_run_config() | {key_of(k): v for k, v in changes.items()}
    return parse_run_config(merged)


#: Run-config keys that say where a run's files go, what is written beside them and whether it
#: resumed, not what it computes: a kept run (``fedapp compare``) or a resumed one may differ
#: from its config.json in these.
#: Every other key is the experiment: ``num-server-rounds`` too (it sets the learning-rate
#: schedule of the rounds already run), and ``eval-every`` (it decided which rounds could become
#: the best checkpoint).
PLACEMENT_KEYS = frozenset({"out-dir", "run-name", "resume", "tensorboard"})
_ABSENT = "(absent)"


def foreign_keys(strategy: str) -> frozenset[str]:
    """The keys of the sections that only other methods read: they never shape a run of
    ``strategy``, so a run folder made before one of them existed still describes its run."""
    own = settings_class(strategy)
    return frozenset(
        f"{kind.name}.{key_of(f.name)}"
        for kind in settings_classes()
        if kind is not own
        for f in fields(kind)
    )


def parse_saved_config(saved: Mapping[str, Any], defaults: Mapping[str, Any]) -> RunConfig:
    """A run folder's config.json as a RunConfig, the keys of other methods' sections it lacks
    taken from ``defaults`` (they never shaped it); ConfigError as :func:`parse_run_config`."""
    strategy = saved.get("strategy")
    foreign = foreign_keys(strategy) if strategy in METHODS else frozenset()
    return parse_run_config({k: v for k, v in defaults.items() if k in foreign} | dict(saved))


def config_differences(
    saved: Mapping[str, Any], cfg: RunConfig, ignored: frozenset[str] = PLACEMENT_KEYS
) -> dict[str, tuple[Any, Any]]:
    """Key -> (value in a run folder's ``saved`` config.json, value in ``cfg``) for every key of
    ``cfg``'s run on which they differ, ``ignored`` keys and other methods' sections aside;
    ``cfg`` as the ServerApp writes it (JSON round trip), so 0.1 and 1e-1 are one value."""
    wanted = json.loads(json.dumps(cfg.as_run_config()))
    keys = sorted((set(saved) | set(wanted)) - ignored - foreign_keys(cfg.strategy))
    return {
        key: (saved.get(key, _ABSENT), wanted.get(key, _ABSENT))
        for key in keys
        if saved.get(key, _ABSENT) != wanted.get(key, _ABSENT)
    }


def describe_differences(differences: Mapping[str, tuple[Any, Any]]) -> str:
    """``key = <saved> there, <wanted> now`` for each key of :func:`config_differences`."""
    return "; ".join(
        f"{key} = {saved!r} there, {wanted!r} now" for key, (saved, wanted) in differences.items()
    )

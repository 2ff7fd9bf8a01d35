"""One typed run configuration, validated once at start on the server and on every client.

Defaults live in exactly one place, ``[tool.flwr.app.config]`` of ``pyproject.toml``, which Flower
fuses with ``--run-config`` overrides; this module only types and checks what arrives. A user
error becomes a :class:`ConfigError` whose message names the key, the value given and what is
allowed, so the apps can stop before any training without a traceback.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fedapp.data.registry import DATASET_NAMES
from fedapp.methods import METHOD_NAMES, METHODS
from fedapp.models.arch import SUPERNETS_DIR, yaml_names
from fedapp.models.cache import CACHES_DIR
from fedapp.models.families import FAMILY_NAMES
from fedapp.models.masks import MEASURES, TOPK_RULES
from fedapp.models.zoo import model_names
from fedapp.partitions.budgets import RNG_KINDS
from fedapp.partitions.factory import PARTITIONER_NAMES
from fedapp.training.logit_fusion import LOGIT_AGGREGATIONS

DEVICES = ("auto", "cpu", "cuda")
LR_SCHEDULES = ("constant", "cosine")
#: FEAST's training rule and its ablations (paper Table 6): which variants train per mini-batch.
TRAINING_RULES = ("full", "min-max-kd", "min-max", "max", "min")
#: SuperFedNAS/DeepFedNAS transfers: draw subnets from the whole space or the affordable set.
#: ``feast-transfer``: the FEAST authors' SuperFedNAS transfer (global min, best-of-20 max).
SUBNET_SAMPLINGS = ("budget-constrained", "unconstrained", "feast-transfer")
#: HeteroFL: widths by budget, the authors' fixed equal proportions, or drawn anew each round.
HETEROFL_ASSIGNMENTS = ("budget", "proportion", "dynamic")
#: ScaleFL self-distillation: the authors' code, or the FEAST authors' port.
SCALEFL_KD_FORMS = ("official", "feast")
#: FedKD-NAS controller: score candidates on a private hold-out (its labels) or on a public
#: hold-out against the broadcast target (Z~ or P_T; the global distribution).
NAS_SCORE_SETS = ("private", "public")
#: The methods with a server-trained teacher and the client NAS controller.
TEACHER_METHODS = ("fedkd-nas", "local-kd")


class ConfigError(ValueError):
    """A run-config value that cannot be used; the message is meant for the user as it is."""


@dataclass(frozen=True)
class RunConfig:
    """Every run-config key, typed; field ``foo_bar`` is key ``foo-bar``."""

    # the federation
    strategy: str
    seed: int
    num_server_rounds: int
    num_clients: int
    fraction_train: float
    min_train_clients: int
    round_timeout: float
    node_wait_timeout: float
    # data and its split between server and clients
    dataset: str
    data_dir: str
    partitioner: str
    dirichlet_alpha: float
    shards_per_client: int
    calibration_size: int
    validation_size: int
    public_size: int
    test_size: int
    client_pool_size: int
    # compute budgets (MACs) and their link to data shares
    budget_min: float
    budget_max: float
    zipf_s: float
    budget_rng: str
    cohort_rng: str
    gamma: float
    allocation_cap: float
    # local training
    model: str
    local_epochs: int
    batch_size: int
    learning_rate: float
    momentum: float
    weight_decay: float
    lr_schedule: str
    device: str
    client_threads: int
    # FEAST: elastic supernet, variant cache, routed co-training
    supernet: str
    variant_cache: str
    routing: bool
    training_rule: str
    kd_weight: float
    grad_clip: float
    mix_batches: bool
    anchor_variants: str
    # weight-sharing baselines on the ResNet18 substrate: HeteroFL, ScaleFL, FIARSE
    substrate: str
    fiarse_grid_points: int
    fiarse_budget: str
    fiarse_topk: str
    heterofl_assignment: str
    scalefl_exit_convs: int
    scalefl_kd_gamma: float
    scalefl_kd_temperature: float
    scalefl_kd_form: str
    # SuperFedNAS / DeepFedNAS transfers on the FEAST supernet
    subnet_sampling: str
    maxnet_decay_fraction: float
    maxnet_weight_examples: bool
    # FedKD-NAS and its client NAS controller (Local-KD shares them)
    nas_family: str
    nas_lambda: float
    nas_margin: float
    nas_keep: int
    nas_holdout: float
    nas_memory_mb: float
    nas_duel_every: int
    nas_warmup_steps: int
    nas_score_on: str
    nas_public_holdout: float
    kd_alpha: float
    kd_temperature: float
    kd_steps: int
    teacher_beta: float
    ema_gamma: float
    logit_aggregation: str
    trim_fraction: float
    teacher_epochs: int
    teacher_model: str
    teacher_folds: int
    # FedMD, FedDistill (public-set logit methods)
    alignment_size: int
    pretrain_public_epochs: int
    pretrain_private_epochs: int
    digest_epochs: int
    revisit_epochs: int
    feddistill_weight: float
    feddistill_exclude_own: bool
    # FedDF, Ditto
    distill_steps: int
    distill_eval_every: int
    distill_patience: int
    distill_batch_size: int
    distill_lr: float
    distill_grad_clip: float
    ditto_lambda: float
    # evaluation and outputs
    eval_every: int
    out_dir: str
    run_name: str
    resume: bool
    tensorboard: bool  # TensorBoard event files beside the run's files (server only)

    @property
    def cohort_size(self) -> int:
        """Clients sampled per round: Flower's rule, max(min-train, fraction of the population)."""
        return max(self.min_train_clients, int(self.fraction_train * self.num_clients))

    def resolved_out_dir(self) -> Path:
        """Absolute output folder: ``out-dir`` (``~`` expanded) or ``~/fedapp-runs`` if empty."""
        base = Path(os.path.expanduser(self.out_dir or "~/fedapp-runs"))
        return base.resolve()

    def as_run_config(self) -> dict[str, Any]:
        """The configuration back in Flower's kebab-case form (for result files)."""
        return {key_of(f.name): getattr(self, f.name) for f in fields(self)}


def key_of(field_name: str) -> str:
    """Run-config key of a dataclass field."""
    return field_name.replace("_", "-")


#: (predicate, what is allowed); the description may be a callable, read only on an error.
Check = tuple[Callable[[Any], bool], str | Callable[[], str]]
#: A list of allowed names, or a callable giving it (file listings are read only when checked).
Names = tuple[str, ...] | Callable[[], tuple[str, ...]]


def _one_of(names: Names) -> Check:
    def listed() -> tuple[str, ...]:
        return names() if callable(names) else names

    return (lambda v: v in listed(), lambda: "one of " + ", ".join(repr(n) for n in listed()))


def _at_least(low: float) -> Check:
    return (lambda v: v >= low, f">= {low:g}")


def _positive() -> Check:
    return (lambda v: v > 0, "> 0")


_CHECKS: dict[str, Check] = {
    "strategy": _one_of(METHOD_NAMES),
    "num_server_rounds": _at_least(1),
    "num_clients": _at_least(1),
    "fraction_train": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "min_train_clients": _at_least(1),
    "round_timeout": _positive(),
    "node_wait_timeout": _positive(),
    "dataset": _one_of(DATASET_NAMES),
    "partitioner": _one_of(PARTITIONER_NAMES),
    "dirichlet_alpha": _positive(),
    "shards_per_client": _at_least(1),
    "calibration_size": _at_least(0),
    "validation_size": _at_least(1),
    "public_size": _at_least(0),
    "test_size": _at_least(1),
    "client_pool_size": _at_least(0),
    "budget_min": _positive(),
    "budget_max": _positive(),
    "zipf_s": _at_least(0),
    "budget_rng": _one_of(RNG_KINDS),
    "cohort_rng": _one_of(RNG_KINDS),
    "gamma": _at_least(0),
    "allocation_cap": _positive(),
    "model": _one_of(model_names),
    "local_epochs": _at_least(1),
    "batch_size": _at_least(1),
    "learning_rate": _positive(),
    "momentum": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "weight_decay": _at_least(0),
    "lr_schedule": _one_of(LR_SCHEDULES),
    "device": _one_of(DEVICES),
    "client_threads": _at_least(0),
    "supernet": _one_of(lambda: yaml_names(SUPERNETS_DIR)),
    "variant_cache": _one_of(lambda: yaml_names(CACHES_DIR)),
    "substrate": _one_of(lambda: yaml_names(SUPERNETS_DIR)),
    "fiarse_grid_points": _at_least(2),
    "fiarse_budget": _one_of(MEASURES),
    "fiarse_topk": _one_of(TOPK_RULES),
    "heterofl_assignment": _one_of(HETEROFL_ASSIGNMENTS),
    "scalefl_kd_form": _one_of(SCALEFL_KD_FORMS),
    "scalefl_exit_convs": _at_least(0),
    "scalefl_kd_gamma": _at_least(0),
    "scalefl_kd_temperature": _positive(),
    "training_rule": _one_of(TRAINING_RULES),
    "kd_weight": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "grad_clip": _positive(),
    "anchor_variants": (
        lambda v: v == "" or all(p.strip().isdigit() for p in v.split(",")),
        "empty (5 evenly spaced variants) or comma-separated cache indices like '0,3,9'",
    ),
    # SuperFedNAS / DeepFedNAS transfers
    "subnet_sampling": _one_of(SUBNET_SAMPLINGS),
    "maxnet_decay_fraction": (lambda v: 0 < v <= 1, "in (0, 1]"),
    # FedKD-NAS / Local-KD
    "nas_family": _one_of(("auto", *FAMILY_NAMES)),
    "nas_lambda": _at_least(0),
    "nas_margin": _at_least(0),
    "nas_keep": _at_least(1),
    "nas_holdout": (lambda v: 0 < v <= 0.5, "in (0, 0.5]"),
    "nas_memory_mb": _at_least(0),
    "nas_duel_every": _at_least(0),
    "nas_warmup_steps": _at_least(0),
    "nas_score_on": _one_of(NAS_SCORE_SETS),
    "nas_public_holdout": (lambda v: 0 < v <= 0.5, "in (0, 0.5]"),
    "kd_steps": _at_least(0),
    "kd_alpha": _at_least(0),
    "kd_temperature": _positive(),
    "teacher_beta": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "ema_gamma": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "logit_aggregation": _one_of(LOGIT_AGGREGATIONS),
    "trim_fraction": (lambda v: 0 <= v < 0.5, "in [0, 0.5)"),
    "teacher_epochs": _at_least(0),
    "teacher_model": (
        lambda v: v == "" or v in model_names(),
        lambda: (
            "empty (the family's largest candidate) or a model name: " + ", ".join(model_names())
        ),
    ),
    "teacher_folds": _at_least(1),
    # FedDF, Ditto
    "distill_steps": _at_least(1),
    "distill_eval_every": _at_least(1),
    "distill_patience": _at_least(1),
    "distill_batch_size": _at_least(1),
    "distill_lr": _positive(),
    "distill_grad_clip": _positive(),
    "ditto_lambda": _at_least(0),
    # FedMD, FedDistill
    "alignment_size": _at_least(1),
    "pretrain_public_epochs": _at_least(0),
    "pretrain_private_epochs": _at_least(0),
    "digest_epochs": _at_least(1),
    "revisit_epochs": _at_least(0),
    "feddistill_weight": _at_least(0),
    "eval_every": _at_least(1),
}


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


def _cross_checks(cfg: RunConfig) -> list[str]:
    """Constraints between keys."""
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
    if METHODS[cfg.strategy].needs_public_set and cfg.public_size < 1:
        problems.append(
            f"strategy {cfg.strategy!r} distils on a public set, but 'public-size' = "
            f"{cfg.public_size}: set it to the number of server-held public images (e.g. 500)"
        )
    elif cfg.strategy == "fedmd" and cfg.alignment_size > cfg.public_size:
        problems.append(
            f"'alignment-size' = {cfg.alignment_size} is larger than 'public-size' = "
            f"{cfg.public_size}: FedMD draws its alignment subsets from the public set, so "
            "allowed is 1 to public-size"
        )
    if cfg.subnet_sampling == "feast-transfer" and cfg.strategy == "deepfednas":
        problems.append(
            "'subnet-sampling' = 'feast-transfer' is the FEAST authors' SuperFedNAS sampler "
            "(random architectures of the whole space); DeepFedNAS samples its cached path: "
            "use 'budget-constrained' or 'unconstrained'"
        )
    if cfg.strategy in TEACHER_METHODS and cfg.teacher_folds > max(cfg.public_size, 1):
        problems.append(
            f"'teacher-folds' = {cfg.teacher_folds} is larger than 'public-size' = "
            f"{cfg.public_size}: every fold needs at least one public image, so allowed is 1 to "
            "public-size"
        )
    if cfg.strategy in TEACHER_METHODS and cfg.nas_score_on == "public" and cfg.teacher_beta == 0:
        problems.append(
            "'nas-score-on' = 'public' (the default) scores candidates against the teacher's or "
            "the fused logits, but 'teacher-beta' = 0 sends none in round 1 (none ever to "
            "Local-KD): set teacher-beta > 0 or nas-score-on = 'private'"
        )
    if cfg.resume and not cfg.run_name:
        problems.append(
            "'resume' = true needs 'run-name': the run to continue is <out-dir>/<run-name>"
        )
    return problems


def parse_run_config(run_config: Mapping[str, Any]) -> RunConfig:
    """Type and validate Flower's run config; raises ConfigError listing every problem found."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for f in fields(RunConfig):
        key = key_of(f.name)
        if key not in run_config:
            problems.append(
                f"run config key '{key}' is missing (every key has a default in "
                "[tool.flwr.app.config] of pyproject.toml)"
            )
            continue
        try:
            value = _coerce(
                key, run_config[key], {"str": str, "int": int, "float": float, "bool": bool}[f.type]
            )
        except ConfigError as err:
            problems.append(str(err))
            continue
        check = _CHECKS.get(f.name)
        if check is not None and not check[0](value):
            allowed = check[1]() if callable(check[1]) else check[1]
            problems.append(f"run config '{key}' = {value!r} is not allowed: must be {allowed}")
            continue
        values[f.name] = value
    if not problems:
        cfg = RunConfig(**values)
        problems = _cross_checks(cfg)
        if not problems:
            return cfg
    raise ConfigError("invalid run configuration:\n  - " + "\n  - ".join(problems))


#: Keys added after runs were saved, with the value those runs behaved as: a run folder's
#: config.json written before a key existed still parses (:func:`parse_saved_run_config`).
LATER_KEYS: dict[str, Any] = {"tensorboard": False}


def parse_saved_run_config(saved: Mapping[str, Any]) -> RunConfig:
    """A run folder's config.json as a RunConfig; keys it predates take their LATER_KEYS value."""
    return parse_run_config({**LATER_KEYS, **saved})


def replace(cfg: RunConfig, **changes: Any) -> RunConfig:
    """A validated copy with some fields changed (used by tests and the comparison tools)."""
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


def config_differences(
    saved: Mapping[str, Any], cfg: RunConfig, ignored: frozenset[str] = PLACEMENT_KEYS
) -> dict[str, tuple[Any, Any]]:
    """Key -> (value in a run folder's ``saved`` config.json, value in ``cfg``) for every key on
    which they differ, ``ignored`` keys aside; ``cfg`` as the ServerApp writes it (JSON round
    trip), so 0.1 and 1e-1 are one value."""
    wanted = json.loads(json.dumps(cfg.as_run_config()))
    keys = sorted((set(saved) | set(wanted)) - ignored)
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

"""The fixed variant cache: the operating points FEAST trains, routes and serves.

A cache file (``conf/caches/<name>.yaml``) names its supernet and lists architectures with their
MACs and parameters, plus how it was made (GA settings and seeds, or the imported file). On load
the MACs and parameters are always recounted for the supernet in use (e.g. the reference CSV was
counted with 10 classes; FEAST recounts at 100) and the variants are sorted by MACs, so index 0 is
the cheapest variant everywhere.

Each variant carries two MAC figures: ``macs`` of the network as built, and ``nominal_macs`` as the
supernet's published figures count it (:meth:`SupernetConfig.nominal`; the FEAST authors' counter
sizes middle channels by another rule than their networks do). Affordability, the sort order and
the cache's MAC range follow the nominal figure, as the authors' code does, so cache indices and
the clients' affordable sets are the paper's; everything that reports cost uses ``macs``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedapp.models.arch import CACHES_DIR, Arch, SupernetConfig, load_supernet, named_yaml
from fedapp.models.counter import count
from fedapp.models.ga import GAParams, SearchResult, search

FORMAT = "fedapp-variant-cache/1"


@dataclass(frozen=True)
class Variant:
    """One cached architecture, its cost on the cache's supernet, and where it came from."""

    arch: Arch
    macs: int
    params: int
    target_macs: float | None = None
    seed: int | None = None
    #: MACs by the supernet's nominal counter (equal to ``macs`` unless the rules differ).
    nominal_macs: int = -1

    def __post_init__(self) -> None:
        if self.nominal_macs < 0:
            object.__setattr__(self, "nominal_macs", self.macs)


@dataclass(frozen=True)
class VariantCache:
    """Variants sorted by MACs (stable), counted on ``config``."""

    config: SupernetConfig
    variants: tuple[Variant, ...]
    supernet_overrides: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError("a variant cache needs at least one variant")

    def __len__(self) -> int:
        return len(self.variants)

    @property
    def archs(self) -> list[Arch]:
        return [v.arch for v in self.variants]

    @property
    def macs(self) -> np.ndarray:
        """Built MACs of every variant, in cache order."""
        return np.array([v.macs for v in self.variants], dtype=np.int64)

    @property
    def nominal_macs(self) -> np.ndarray:
        """Nominal MACs of every variant (the affordability scale), increasing."""
        return np.array([v.nominal_macs for v in self.variants], dtype=np.int64)

    @property
    def min_macs(self) -> int:
        """Nominal MACs of the cheapest variant: the least budget that affords anything."""
        return self.variants[0].nominal_macs

    @property
    def max_macs(self) -> int:
        """Nominal MACs of the most expensive variant."""
        return self.variants[-1].nominal_macs


def make_cache(
    config: SupernetConfig,
    entries: Iterable[tuple[Arch, float | None, int | None]],
    source: dict[str, Any] | None = None,
    supernet_overrides: dict[str, Any] | None = None,
) -> VariantCache:
    """Count ``(arch, target_macs, seed)`` entries on ``config`` and sort them by nominal MACs."""
    nominal = config.nominal()
    variants = []
    for arch, target, seed in entries:
        cost = count(config, arch)
        variants.append(
            Variant(
                config.validate(arch),
                cost.macs,
                cost.params,
                target,
                seed,
                count(nominal, arch).macs,
            )
        )
    variants.sort(key=lambda v: v.nominal_macs)
    return VariantCache(config, tuple(variants), dict(supernet_overrides or {}), dict(source or {}))


def resolve_cache_path(name_or_path: str | Path) -> Path:
    """A cache file from a path, or from a name in ``conf/caches``."""
    return named_yaml(name_or_path, CACHES_DIR, "variant cache")


def load_cache(
    name_or_path: str | Path, config: SupernetConfig | None = None, **overrides: Any
) -> VariantCache:
    """Load a cache file and count it on ``config``.

    Without ``config`` it is counted on the supernet the file names, with the file's overrides
    and then ``overrides`` (e.g. ``num_classes=10``) applied.
    """
    path = resolve_cache_path(name_or_path)
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path} is not a variant cache (expected format: {FORMAT})")
    if config is not None and overrides:
        raise ValueError("pass either a supernet config or overrides, not both")
    overrides = {**(raw.get("supernet_overrides") or {}), **overrides}
    if config is None:
        config = load_supernet(raw["supernet"], **overrides)
    try:
        entries = [
            (
                Arch(tuple(v["d"]), tuple(v["e"]), tuple(v["w"])),
                v.get("target_macs"),
                v.get("seed"),
            )
            for v in raw["variants"]
        ]
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: every variant needs d, e and w ({err})") from None
    return make_cache(config, entries, raw.get("source"), overrides)


def dump_cache(cache: VariantCache) -> str:
    """The YAML text of a cache: header in block style, one flow-style line per variant."""
    header = {
        "format": FORMAT,
        "supernet": cache.config.name,
        "supernet_overrides": cache.supernet_overrides,
        "counted_with": {
            "num_classes": cache.config.num_classes,
            "image_size": cache.config.image_size,
            "in_channels": cache.config.in_channels,
        },
        "macs_range": [cache.min_macs, cache.max_macs],
        "source": cache.source,
    }
    lines = [yaml.safe_dump(header, sort_keys=False).rstrip(), "variants:"]
    for v in cache.variants:
        entry: dict[str, Any] = {**v.arch.as_dict(), "macs": v.macs, "params": v.params}
        if v.nominal_macs != v.macs:
            entry["nominal_macs"] = v.nominal_macs
        if v.target_macs is not None:
            entry["target_macs"] = int(v.target_macs)
        if v.seed is not None:
            entry["seed"] = v.seed
        flow = yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=10_000)
        lines.append(f"- {flow.strip()}")
    return "\n".join(lines) + "\n"


def save_cache(cache: VariantCache, path: str | Path) -> Path:
    """Write a cache file (creating its folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_cache(cache))
    return path


def import_reference_csv(
    path: str | Path, config: SupernetConfig, supernet_overrides: dict[str, Any] | None = None
) -> VariantCache:
    """Read the FEAST authors' cache CSV (columns ``d``, ``e``, ``w_indices`` as JSON lists).

    Rows are kept as they are, duplicates included, so indices match the paper's.
    """
    path = Path(path)
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    missing = {"d", "e", "w_indices"} - set(rows[0] if rows else {})
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
    entries = []
    for row in rows:
        arch = Arch(
            tuple(json.loads(row["d"])),
            tuple(json.loads(row["e"])),
            tuple(json.loads(row["w_indices"])),
        )
        target = float(row["job_target_macs"]) if row.get("job_target_macs") else None
        seed = int(row["job_seed"]) if row.get("job_seed") else None
        entries.append((arch, target, seed))
    return make_cache(config, entries, {"method": "import", "file": path.name}, supernet_overrides)


def import_cache(
    path: str | Path, config: SupernetConfig, supernet_overrides: dict[str, Any] | None = None
) -> VariantCache:
    """Take the architectures of a reference CSV or of another cache file onto ``config``.

    This is how a cache moves to another data set (e.g. CIFAR-100 variants on TinyImageNet,
    recounted there), as the paper does.
    """
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return import_reference_csv(path, config, supernet_overrides)
    source = load_cache(path, config)
    entries = [(v.arch, v.target_macs, v.seed) for v in source.variants]
    return make_cache(config, entries, {"method": "import", "file": path.name}, supernet_overrides)


@dataclass(frozen=True)
class Segment:
    """``count`` GA targets linearly spaced over [start, stop] MACs with seeds seed, seed+1, ..."""

    start: float
    stop: float
    count: int
    rho0: float
    seed: int

    @property
    def targets(self) -> list[float]:
        return [float(t) for t in np.linspace(self.start, self.stop, self.count)]

    @classmethod
    def parse(cls, text: str) -> Segment:
        """Parse ``START:STOP:COUNT:RHO0:SEED``, e.g. ``50e6:600e6:50:0.31:42``."""
        parts = text.split(":")
        if len(parts) != 5:
            raise ValueError(f"segment {text!r} must be START:STOP:COUNT:RHO0:SEED")
        try:
            start, stop, n, rho0, seed = (float(p) for p in parts)
        except ValueError:
            raise ValueError(f"segment {text!r} must be five numbers") from None
        if n < 1 or start > stop or n != int(n) or seed != int(seed):
            raise ValueError(f"segment {text!r}: need START <= STOP and whole COUNT, SEED >= 1")
        return cls(start, stop, int(n), rho0, int(seed))


def _search_job(job: tuple[SupernetConfig, float, float, int, GAParams]) -> SearchResult:
    return search(*job)


def search_segments(
    config: SupernetConfig,
    segments: Sequence[Segment],
    params: GAParams | None = None,
    workers: int = 1,
) -> list[SearchResult]:
    """One GA search per target of every segment, in segment order.

    Targets are independent, so ``workers > 1`` runs them in parallel processes; the results do
    not depend on ``workers``.
    """
    params = GAParams() if params is None else params
    jobs = [
        (config, target, seg.rho0, seg.seed + i, params)
        for seg in segments
        for i, target in enumerate(seg.targets)
    ]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            return list(pool.map(_search_job, jobs))
    return [_search_job(job) for job in jobs]


def build_cache(
    config: SupernetConfig,
    segments: Sequence[Segment],
    params: GAParams | None = None,
    workers: int = 1,
    supernet_overrides: dict[str, Any] | None = None,
) -> VariantCache:
    """The searches of ``search_segments``, deduplicated (first target kept) and MAC-sorted."""
    params = GAParams() if params is None else params
    results = search_segments(config, segments, params, workers)
    seen: set[Arch] = set()
    entries = []
    for r in results:
        if r.arch not in seen:
            seen.add(r.arch)
            entries.append((r.arch, r.mac_limit, r.seed))
    source = {
        "method": "ga",
        "ga": asdict(params),
        "segments": [asdict(s) for s in segments],
        "searches": len(results),
        "duplicates_dropped": len(results) - len(entries),
    }
    return make_cache(config, entries, source, supernet_overrides)

"""A fleet file: the device classes of a fleet, how the run's clients map onto them, and when
each client is reachable.

A fleet is a TOML file (``conf/fleets/<name>.toml``, or any path)::

    description = "..."
    assignment = "budget-rank"      # or "partition": the [partitions] table names each one's class

    [[class]]
    name = "raspberry-pi-4"
    share = 0.25                    # of the clients (budget-rank); the shares sum to 1
    macs-per-second = 7.9e9         # training rate: forward + backward MACs per second
    memory-mb = 4096
    download-mbps = 77.0            # Mbit/s
    upload-mbps = 44.1
    availability = 1.0              # share of rounds the device is reachable (seeded draw)
    estimate = false                # derived, not measured on the device
    source = "where the figures come from"

    [partitions]                    # assignment = "partition": partition id -> class name
    "0" = "raspberry-pi-4"

    [traces]                        # optional: partition id -> reachable (1) or not (0) per
    "3" = [1, 1, 0, 1]              # round, cycled; it replaces the class's availability draw

By budget rank, the clients with the largest budgets get the fastest classes: the clients sorted by
(budget, partition id), the classes by (rate, name), and each class takes its share of them in
that order (largest remainders round the counts). The run's budgets stay its own.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedapp.evaluation.fleet_clock import DeviceClass
from fedapp.partitions.apportion import apportion
from fedapp.random_streams import Stream, stream_rng

#: Where named fleets live (``fleet.file = "<name>"``).
FLEETS_DIR = Path(__file__).resolve().parents[2] / "conf" / "fleets"
ASSIGNMENTS = ("budget-rank", "partition")
_CLASS_KEYS = {
    "name": str,
    "share": float,
    "macs-per-second": float,
    "memory-mb": float,
    "download-mbps": float,
    "upload-mbps": float,
    "availability": float,
    "estimate": bool,
    "source": str,
}
_OPTIONAL = {"share": 0.0, "availability": 1.0, "estimate": False, "source": ""}


class FleetFileError(ValueError):
    """A fleet file that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Fleet:
    """A fleet's device classes and how clients map onto them."""

    name: str
    description: str
    classes: tuple[DeviceClass, ...]
    shares: tuple[float, ...]  # by class, for budget-rank assignment
    assignment: str
    partitions: Mapping[int, str] = field(default_factory=dict)  # partition id -> class name
    traces: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def class_named(self, name: str) -> DeviceClass:
        return next(c for c in self.classes if c.name == name)

    def assign(self, budgets: Sequence[float]) -> tuple[DeviceClass, ...]:
        """Every client's device class, by partition id (``budgets`` by partition id)."""
        if self.assignment == "partition":
            missing = sorted(set(range(len(budgets))) - set(self.partitions))
            if missing:
                raise FleetFileError(
                    f"fleet {self.name!r}: [partitions] names no class for partition(s) "
                    f"{missing[:10]} of the run's {len(budgets)}"
                )
            return tuple(self.class_named(self.partitions[p]) for p in range(len(budgets)))
        order = sorted(range(len(budgets)), key=lambda p: (budgets[p], p))
        by_speed = sorted(
            range(len(self.classes)),
            key=lambda c: (self.classes[c].macs_per_second, self.classes[c].name),
        )
        counts = apportion([self.shares[c] for c in by_speed], len(budgets))
        assigned: dict[int, DeviceClass] = {}
        position = 0
        for class_index, count in zip(by_speed, counts, strict=True):
            for partition in order[position : position + count]:
                assigned[partition] = self.classes[class_index]
            position += count
        return tuple(assigned[p] for p in range(len(budgets)))

    def available(self, device: DeviceClass, seed: int, server_round: int, partition: int) -> bool:
        """Whether a client is reachable in a round: its trace, else a draw on its own stream
        with its class's availability (always, at availability 1)."""
        trace = self.traces.get(partition)
        if trace is not None:
            return bool(trace[(server_round - 1) % len(trace)])
        if device.availability >= 1.0:
            return True
        draw = stream_rng(seed, Stream.AVAILABILITY, server_round, partition).random()
        return bool(draw < device.availability)


def fleet_names() -> tuple[str, ...]:
    """The named fleets of ``conf/fleets``."""
    return tuple(sorted(p.stem for p in FLEETS_DIR.glob("*.toml")))


def is_fleet_name(name_or_path: str) -> bool:
    """Whether ``fleet.file`` names a fleet of conf/fleets (which every node's app holds)
    rather than giving a path."""
    return not Path(name_or_path).suffix and "/" not in name_or_path


def fleet_path(name_or_path: str) -> Path:
    """A fleet file by name (``conf/fleets/<name>.toml``) or by path."""
    if is_fleet_name(name_or_path):
        return FLEETS_DIR / f"{name_or_path}.toml"
    return Path(name_or_path).expanduser()


def load_fleet(name_or_path: str) -> Fleet:
    """Read and check a fleet file; FleetFileError says what is wrong."""
    path = fleet_path(name_or_path)
    if not path.is_file():
        raise FleetFileError(
            f"no fleet {name_or_path!r}: not a file, nor one of conf/fleets "
            f"({', '.join(fleet_names())})"
        )
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise FleetFileError(f"fleet file {path}: not readable TOML: {err}") from None
    return parse_fleet(raw, path.stem, str(path))


def parse_fleet(raw: Mapping[str, Any], name: str, where: str) -> Fleet:
    """A fleet from a fleet file's TOML table; ``where`` names it in errors."""
    unknown = set(raw) - {"description", "assignment", "class", "partitions", "traces"}
    if unknown:
        raise FleetFileError(f"fleet file {where}: unknown key(s) {sorted(unknown)}")
    assignment = raw.get("assignment", "budget-rank")
    if assignment not in ASSIGNMENTS:
        raise FleetFileError(
            f"fleet file {where}: assignment = {assignment!r}, must be one of {ASSIGNMENTS}"
        )
    tables = raw.get("class")
    if not isinstance(tables, list) or not tables:
        raise FleetFileError(f"fleet file {where}: needs at least one [[class]] table")
    classes, shares = zip(*(_device_class(t, where) for t in tables), strict=True)
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise FleetFileError(f"fleet file {where}: class names repeat: {names}")
    if assignment == "budget-rank" and not math.isclose(sum(shares), 1.0, abs_tol=1e-6):
        raise FleetFileError(
            f"fleet file {where}: the classes' shares sum to {sum(shares):g}, must be 1"
        )
    partitions = _partition_table(raw.get("partitions", {}), where, "partitions")
    for partition, class_name in partitions.items():
        if class_name not in names:
            raise FleetFileError(
                f"fleet file {where}: partition {partition} names class {class_name!r}, "
                f"not one of {names}"
            )
    if assignment == "partition" and not partitions:
        raise FleetFileError(f"fleet file {where}: assignment = 'partition' needs [partitions]")
    traced = _partition_table(raw.get("traces", {}), where, "traces")
    traces = {p: _trace(t, where, p) for p, t in traced.items()}
    return Fleet(
        name=name,
        description=str(raw.get("description", "")),
        classes=tuple(classes),
        shares=tuple(shares),
        assignment=assignment,
        partitions=partitions,
        traces=traces,
    )


def _device_class(table: Any, where: str) -> tuple[DeviceClass, float]:
    if not isinstance(table, dict):
        raise FleetFileError(f"fleet file {where}: every [[class]] must be a table")
    label = f"fleet file {where}, class {table.get('name', '?')!r}"
    unknown = set(table) - set(_CLASS_KEYS)
    missing = set(_CLASS_KEYS) - set(table) - set(_OPTIONAL)
    if unknown or missing:
        raise FleetFileError(
            f"{label}: unknown key(s) {sorted(unknown)}, missing key(s) {sorted(missing)}"
        )
    values = _OPTIONAL | dict(table)
    for key, kind in _CLASS_KEYS.items():
        value = values[key]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        ok = (number and math.isfinite(value)) if kind is float else isinstance(value, kind)
        if not ok:
            raise FleetFileError(f"{label}: {key} = {value!r} must be a {kind.__name__}")
    for key in ("macs-per-second", "memory-mb", "download-mbps", "upload-mbps"):
        if values[key] <= 0:
            raise FleetFileError(f"{label}: {key} = {values[key]!r} must be > 0")
    if not 0 < values["availability"] <= 1:
        raise FleetFileError(
            f"{label}: availability = {values['availability']!r} must be in (0, 1]"
        )
    if not 0 <= values["share"] <= 1:
        raise FleetFileError(f"{label}: share = {values['share']!r} must be in [0, 1]")
    device = DeviceClass(
        name=values["name"],
        macs_per_second=float(values["macs-per-second"]),
        memory_mb=float(values["memory-mb"]),
        download_mbps=float(values["download-mbps"]),
        upload_mbps=float(values["upload-mbps"]),
        availability=float(values["availability"]),
        source=values["source"],
        estimate=values["estimate"],
    )
    return device, float(values["share"])


def _partition_table(table: Any, where: str, name: str) -> dict[int, Any]:
    if not isinstance(table, dict) or not all(str(k).isdigit() for k in table):
        raise FleetFileError(f"fleet file {where}: [{name}] must map partition ids to values")
    return {int(k): v for k, v in table.items()}


def _trace(trace: Any, where: str, partition: int) -> tuple[int, ...]:
    if not isinstance(trace, list) or not trace or any(v not in (0, 1) for v in trace):
        raise FleetFileError(
            f"fleet file {where}: traces.{partition} must be a non-empty list of 0 and 1"
        )
    return tuple(int(v) for v in trace)


def class_entry(name: str, macs_per_second: float, memory_mb: float, source: str) -> str:
    """A ``[[class]]`` table for a fleet file from a device's measured rate and memory
    (``fedapp profile``); its links are left at 0 for the user to fill in (a fleet file refuses
    them until then)."""
    return "\n".join(
        [
            "[[class]]",
            f'name = "{name}"',
            "share = 0.0                      # of the clients, by budget rank",
            f"macs-per-second = {macs_per_second:.4g}",
            f"memory-mb = {memory_mb:.0f}",
            "download-mbps = 0                # fill in: its link, e.g. from iperf3",
            "upload-mbps = 0",
            "availability = 1.0",
            "estimate = false",
            f'source = "{source}"',
        ]
    )

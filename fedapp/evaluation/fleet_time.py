"""A run's progress against the fleet's time: the fleet seconds of a run kept from before the
clock (from its own files), and the fleet time at which a run first reaches an accuracy."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from fedapp.evaluation.fleet_clock import DeviceClass
from fedapp.evaluation.intervals import wilson_interval

FLEET_SECONDS = "fleet-seconds"  # a round's length on the fleet (client phase + server work)
FLEET_CLIENTS = "fleet-seconds-clients"  # its client phase alone
FLEET_TOTAL = "fleet-seconds-total"  # the run's fleet seconds up to and including the round


def kept_round_seconds(
    rows: Sequence[Mapping[str, Any]],
    communication: Sequence[Mapping[str, Any]],
    compute_by_partition: Mapping[int, float],
    devices: Sequence[DeviceClass],
) -> dict[int, float]:
    """Round -> fleet seconds of a wait-for-all run that predates the clock, from its files:
    each accepted client-round's bytes (communication.csv) and its partition's mean compute
    per client-round (summary.json's compute proxy by client over its client-rounds), on the
    partition's device class; a round lasts as long as its slowest client-round plus the
    server's measured ``seconds-aggregate``. Exact where a partition's work is the same every
    round it takes part in (fixed data, epochs and model); an average otherwise."""
    taken = Counter(int(r["partition"]) for r in communication)
    slowest: dict[int, float] = {}
    for r in communication:
        partition = int(r["partition"])
        macs = compute_by_partition.get(partition, 0.0) / taken[partition]
        seconds = devices[partition].client_round_seconds(
            float(r["bytes_down"]), macs, float(r["bytes_up"])
        )
        server_round = int(r["round"])
        slowest[server_round] = max(slowest.get(server_round, 0.0), seconds)
    return {
        int(row["round"]): slowest.get(int(row["round"]), 0.0)
        + float(row.get("seconds-aggregate", 0.0))
        for row in rows
    }


def time_to_target(
    rows: Sequence[Mapping[str, Any]], target: float, key: str
) -> tuple[int, float] | None:
    """(round, fleet seconds so far) of the first validated round whose ``key`` reaches
    ``target``, or None if none does; the validation cadence bounds its resolution."""
    for row in sorted(rows, key=lambda r: int(r["round"])):
        if key in row and float(row[key]) >= target and FLEET_TOTAL in row:
            return int(row["round"]), float(row[FLEET_TOTAL])
    return None


def time_to_target_interval(
    rows: Sequence[Mapping[str, Any]], target: float, key: str, images: int
) -> tuple[float | None, float | None]:
    """Fleet seconds at the first validated round whose 95 % Wilson interval (on ``images``
    validation images) reaches ``target`` with its upper bound (the earliest the validation
    cannot rule out) and with its lower bound (the earliest it shows it); None where none
    does."""
    early = late = None
    for row in sorted(rows, key=lambda r: int(r["round"])):
        if key not in row or FLEET_TOTAL not in row:
            continue
        low, high = wilson_interval(float(row[key]), images)
        if early is None and high >= target:
            early = float(row[FLEET_TOTAL])
        if late is None and low >= target:
            late = float(row[FLEET_TOTAL])
    return early, late

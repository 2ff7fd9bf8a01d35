"""The fleet's clock: how long a client-round lasts on a device, and how long a round lasts under
a round policy.

A client-round on a device downloads its payload, trains and uploads its reply, one after the
other (as a Flower ClientApp does)::

    seconds = 8 * bytes down / (download Mbit/s * 1e6) + training MACs / (MACs per second)
              + 8 * bytes up / (upload Mbit/s * 1e6)

where the training MACs are the compute proxy the client reported (forward and backward MACs of
what it actually trained). A round waits for the replies its policy keeps:

- ``wait-for-all``: every reply; the round lasts as long as the slowest.
- ``deadline``: the replies in by the deadline; a later one is dropped, as a real server would,
  and the round lasts until the deadline when one was late.
- ``over-commit``: the cohort was sampled larger (FedScale's 1.3x); the first ``cohort`` replies
  are kept and the round ends with the last of them, the rest are dropped as surplus.

The clock never touches training: a policy only decides which replies are aggregated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

POLICIES = ("wait-for-all", "deadline", "over-commit")
CLOCKS = ("virtual", "wall")


@dataclass(frozen=True)
class DeviceClass:
    """One kind of device of a fleet: its training rate and links, and how often it is
    reachable; ``source`` says where the figures come from and ``estimate`` whether they were
    derived rather than measured on the device."""

    name: str
    macs_per_second: float
    memory_mb: float
    download_mbps: float
    upload_mbps: float
    availability: float = 1.0
    source: str = ""
    estimate: bool = False

    def client_round_seconds(self, bytes_down: float, macs: float, bytes_up: float) -> float:
        """Download, training and upload, one after the other (the module docstring's rule)."""
        return (
            8.0 * bytes_down / (self.download_mbps * 1e6)
            + macs / self.macs_per_second
            + 8.0 * bytes_up / (self.upload_mbps * 1e6)
        )


@dataclass(frozen=True)
class RoundTime:
    """Which replies a round keeps under its policy, and how long the round's client phase
    lasts in fleet seconds (without the server's own work)."""

    kept: tuple[int, ...]  # node ids, in the order they arrive
    late: tuple[int, ...]  # past the deadline
    surplus: tuple[int, ...]  # beyond the first ``cohort`` under over-commit
    seconds: float


def time_round(
    seconds_by_node: Mapping[int, float], policy: str, deadline: float, cohort: int
) -> RoundTime:
    """The round's kept, late and surplus replies, and its client phase's length, given each
    reply's fleet seconds (``deadline`` is read by ``deadline``, ``cohort`` by ``over-commit``).
    Replies arrive in order of their seconds, ties by node id."""
    if policy not in POLICIES:
        raise ValueError(f"unknown round policy {policy!r}: one of {', '.join(POLICIES)}")
    arrival = sorted(seconds_by_node, key=lambda node: (seconds_by_node[node], node))
    if policy == "deadline":
        kept = tuple(n for n in arrival if seconds_by_node[n] <= deadline)
        late = tuple(n for n in arrival if seconds_by_node[n] > deadline)
        if late:
            return RoundTime(kept, late, (), deadline)
        return RoundTime(kept, (), (), _last(seconds_by_node, kept))
    if policy == "over-commit":
        kept, surplus = tuple(arrival[:cohort]), tuple(arrival[cohort:])
        return RoundTime(kept, (), surplus, _last(seconds_by_node, kept))
    return RoundTime(tuple(arrival), (), (), _last(seconds_by_node, arrival))


def _last(seconds_by_node: Mapping[int, float], nodes: tuple[int, ...] | list[int]) -> float:
    return max((seconds_by_node[n] for n in nodes), default=0.0)

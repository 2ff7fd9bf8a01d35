"""The node handshake: what the server may know about a node before it trains.

The server never reads client data and, in Flower, cannot see node config. So before a node is
first sampled it is sent a QUERY and answers with its profile: partition id, number of training
examples and compute budget (MACs), plus a few device facts. On a device the budget comes from
``--node-config "budget=..."``; in simulation it is derived from the partition id and the run's
seed, exactly as the partitioner derives it. A device with ``data-path`` in its node config trains
on those files, and reports their size as its number of examples.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedapp.data.registry import ImageArrays
from fedapp.run.config import ConfigError
from fedapp.run.exchange import exchange
from fedapp.run.federated_data import client_budgets, client_shard
from fedapp.run.pieces import DataLayout
from fedapp.wire.messages import DATA_FACTS, PROFILE


@dataclass(frozen=True)
class NodeProfile:
    """What a node told the server about itself."""

    node_id: int
    partition_id: int
    num_partitions: int
    num_examples: int
    budget: float
    device: str


@dataclass(frozen=True)
class LocalNode:
    """What a node knows about itself (client side): partition, data, budget, kept state."""

    partition_id: int
    num_partitions: int
    data_path: str | None  # the device's own training files, or None for the seeded shard
    budget: float  # MACs: its node config's, else the seeded draw (what it reported)
    #: Flower's per-node scratch (``Context.state``): survives between this node's messages, so
    #: methods with client-side state (personal models, NAS history) keep it here.
    state: RecordDict = field(default_factory=RecordDict, compare=False, repr=False)

    def shard(self, layout: DataLayout) -> ImageArrays:
        """This node's training examples."""
        return client_shard(layout, self.partition_id, self.data_path)


def local_profile(context: Context, layout: DataLayout) -> ConfigRecord:
    """The profile this node reports (client side); ConfigError if its node config is unusable."""
    node = local_node(context.node_config, layout)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return ConfigRecord(
        {
            "partition-id": node.partition_id,
            "num-partitions": node.num_partitions,
            "num-examples": len(node.shard(layout).labels),
            "budget": node.budget,
            "device": f"{platform.machine()}/{device}",
        }
    )


def local_node(
    node_config: Mapping[str, Any], layout: DataLayout, state: RecordDict | None = None
) -> LocalNode:
    """Partition id and count (checked against the run's population), the device's own data and
    budget, and the node's persistent state (a fresh one if none is given)."""
    try:
        partition_id = int(node_config["partition-id"])
        num_partitions = int(node_config["num-partitions"])
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(
            "node config needs integer 'partition-id' and 'num-partitions' "
            f"(got {dict(node_config)}); on a SuperNode pass "
            '--node-config "partition-id=0 num-partitions=N budget=..."'
        ) from err
    if num_partitions != layout.num_clients:
        raise ConfigError(
            f"the federation has num-partitions = {num_partitions} but run config 'num-clients' = "
            f"{layout.num_clients}; in simulation pass --federation-config "
            f'"num-supernodes={layout.num_clients}" or set num-clients={num_partitions}'
        )
    if not 0 <= partition_id < num_partitions:
        raise ConfigError(
            f"node config 'partition-id' = {partition_id} is outside 0..{num_partitions - 1}"
        )
    return LocalNode(
        partition_id,
        num_partitions,
        node_data_path(node_config),
        node_budget(node_config, layout, partition_id),
        RecordDict() if state is None else state,
    )


def node_data_path(node_config: Mapping[str, Any]) -> str | None:
    """The node's own training data (node config ``data-path``), or None to use its shard."""
    value = node_config.get("data-path")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(
            f"node config 'data-path' = {value!r}: expected a quoted path, e.g. "
            "--node-config 'data-path=\"/home/pi/data.npz\"'"
        )
    return value


def node_budget(node_config: Mapping[str, Any], layout: DataLayout, partition_id: int) -> float:
    """The node's compute budget in MACs: its own node config if given, else the seeded draw."""
    if "budget" not in node_config:
        return float(client_budgets(layout.budgets)[partition_id])
    value = node_config["budget"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"node config 'budget' = {value!r}: expected a finite number of MACs")
    if value <= 0:
        raise ConfigError(f"node config 'budget' = {value!r} is not allowed: must be > 0")
    return float(value)


class ProfileRefused(ValueError):
    """Why the server cannot accept a node's profile (the message names what is wrong)."""


class NodeRegistry:
    """Profiles of the nodes seen so far, keyed by Flower node id (server side).

    A profile is the node's own word, so the server checks it against the run: a partition id in
    0..num-clients-1 that no other connected node holds, num-partitions equal to num-clients, a
    non-negative integer number of examples and a finite positive budget. A node that comes back
    under a new node id with the partition of a node no longer connected replaces that node's
    profile; a second connected node claiming a held partition is refused.

    ``data_facts`` (fedapp.run.federated_data.data_facts), when given, go with every QUERY, so
    that a node can answer without loading the run's data set for its facts.
    """

    def __init__(self, num_clients: int, data_facts: Mapping[str, Any] | None = None) -> None:
        self.num_clients = num_clients
        self.profiles: dict[int, NodeProfile] = {}
        self.refused: dict[int, str] = {}  # node id -> why its profile was not accepted
        self.data_facts = dict(data_facts or {})

    def discover(self, grid: Grid, node_ids: Iterable[int], timeout: float) -> list[str]:
        """QUERY every connected node (``node_ids``) not yet profiled nor refused, record the
        acceptable answers; return, one line each, why a node rejected the run or was refused
        (each also logged; a refused node is not asked again)."""
        node_ids = list(node_ids)
        connected = set(node_ids)
        unknown = [n for n in node_ids if n not in self.profiles and n not in self.refused]
        errors: list[str] = []
        if not unknown:
            return errors
        queries = [
            Message(self._query_content(), dst_node_id=n, message_type=MessageType.QUERY)
            for n in unknown
        ]
        for reply in exchange(grid, queries, timeout):
            node_id = reply.metadata.src_node_id
            if reply.has_error():
                log(WARNING, "node %s failed the handshake: %s", node_id, reply.error.reason)
                errors.append(f"a node rejected the run: {reply.error.reason}")
                continue
            try:
                self._accept(_parse_profile(node_id, reply.content, self.num_clients), connected)
            except Exception as err:  # a profile is the node's word: refused, never a crash
                reason = str(err) if isinstance(err, ProfileRefused) else f"malformed ({err!r})"
                self.refused[node_id] = reason
                log(WARNING, "node %s left out: its profile is refused: %s", node_id, reason)
                errors.append(f"node {node_id}'s profile cannot be accepted: {reason}")
        log(INFO, "handshake: %d node(s) profiled", len(self.profiles))
        return errors

    def _accept(self, profile: NodeProfile, connected: set[int]) -> None:
        """Record a checked profile unless a connected node holds its partition already; a node
        that is gone gives its partition up to the newcomer (the same device, reconnected)."""
        for node_id, held in list(self.profiles.items()):
            if held.partition_id != profile.partition_id:
                continue
            if node_id in connected:
                raise ProfileRefused(
                    f"partition-id {profile.partition_id} is held by connected node {node_id}"
                )
            del self.profiles[node_id]
            log(
                INFO,
                "node %s replaces node %s (gone) as partition %d",
                profile.node_id,
                node_id,
                profile.partition_id,
            )
        self.profiles[profile.node_id] = profile

    def _query_content(self) -> RecordDict:
        if not self.data_facts:
            return RecordDict({})
        return RecordDict({DATA_FACTS: ConfigRecord(self.data_facts)})

    def wait_for(self, grid: Grid, count: int, timeout: float, poll: float = 1.0) -> None:
        """Wait until ``count`` nodes are connected and profiled, or stop with a clear error
        (a node that rejects the run, or whose profile the server cannot accept, stops it)."""
        deadline = time.monotonic() + timeout
        while True:
            errors = self.discover(grid, grid.get_node_ids(), timeout)
            if errors:
                raise ConfigError(errors[0])
            if len(self.profiles) >= count:
                return
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"only {len(self.profiles)} of 'num-clients' = {count} nodes answered the "
                    f"handshake within 'node-wait-timeout' = {timeout:g} s"
                )
            log(INFO, "waiting for nodes: %d of %d profiled", len(self.profiles), count)
            time.sleep(poll)


def _parse_profile(node_id: int, content: RecordDict, num_clients: int) -> NodeProfile:
    """A node's QUERY reply as its profile; ProfileRefused saying what the run cannot accept."""
    record = content.config_records[PROFILE]
    partition_id, num_partitions = record["partition-id"], record["num-partitions"]
    num_examples, budget = record["num-examples"], record["budget"]
    if not _is_int(num_partitions) or num_partitions != num_clients:
        raise ProfileRefused(
            f"num-partitions = {num_partitions!r}, but the run has 'num-clients' = {num_clients}"
        )
    if not _is_int(partition_id) or not 0 <= partition_id < num_clients:
        raise ProfileRefused(f"partition-id = {partition_id!r} is outside 0..{num_clients - 1}")
    if not _is_int(num_examples) or num_examples < 0:
        raise ProfileRefused(f"num-examples = {num_examples!r} is not a non-negative integer")
    if not isinstance(budget, int | float) or isinstance(budget, bool):
        raise ProfileRefused(f"budget = {budget!r} is not a number of MACs")
    if not math.isfinite(budget) or budget <= 0:
        raise ProfileRefused(f"budget = {budget!r} is not a finite positive number of MACs")
    return NodeProfile(
        node_id=node_id,
        partition_id=partition_id,
        num_partitions=num_partitions,
        num_examples=num_examples,
        budget=float(budget),
        device=str(record["device"]),
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

"""The server checks every node's profile against the run (a profile is the node's own word):
partition ids in range and unique among the connected nodes, num-partitions equal to
num-clients, examples and budget that are numbers. Before round 1 a profile it cannot accept
stops the run with one message naming the node and what is wrong; a node that joins later with
one is left out with a logged reason while the run goes on.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, MessageType, RecordDict
from hostile_client import ProfileLies, hostile_app
from local_grid import (
    FIRST_NODE_ID,
    LocalGrid,
    local_federation,
    preset_overrides,
    run_config,
    server_context,
)

from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.profiles import NodeRegistry
from fedapp.wire.records import to_record

FAST = preset_overrides("fedavg-digits") | {"num_clients": 3, "fraction_train": 1.0}


def _config(tmp_path, **overrides: Any) -> dict[str, Any]:
    return run_config(**(FAST | {"out_dir": str(tmp_path), "run_name": "run"} | overrides))


@pytest.mark.parametrize(
    ("claims", "refusal"),
    [
        ({"partition-id": 7}, "partition-id = 7 is outside 0..2"),
        ({"partition-id": 0}, "partition-id 0 is held by connected node"),
        ({"num-partitions": 4}, "num-partitions = 4, but the run has 'num-clients' = 3"),
        ({"num-examples": -5}, "num-examples = -5 is not a non-negative integer"),
        ({"budget": float("inf")}, "budget = inf is not a finite positive number of MACs"),
        ({"budget": "48M"}, "budget = '48M' is not a number of MACs"),
    ],
)
def test_a_profile_the_server_cannot_accept_stops_the_run_before_round_1(
    tmp_path, claims: dict[str, Any], refusal: str
) -> None:
    lies: ProfileLies = {2: claims}
    config = _config(tmp_path)
    server_context(config)
    grid = LocalGrid(hostile_app({}, lies), config, num_nodes=3)
    nodes = NodeRegistry(parse_run_config(config).num_clients)
    with pytest.raises(ConfigError) as refused:
        nodes.wait_for(grid, 3, timeout=5)
    message = str(refused.value)
    assert f"node {FIRST_NODE_ID + 2}'s profile cannot be accepted" in message, message
    assert refusal in message, message
    assert FIRST_NODE_ID + 2 not in nodes.profiles


def test_a_node_joining_later_with_a_held_partition_is_left_out(tmp_path, caplog) -> None:
    config = _config(tmp_path)
    _, grid, nodes, strategy = local_federation(config, num_nodes=3)
    state = to_record(strategy.initial_state())
    assert len(list(strategy.configure_train(1, state, ConfigRecord(), grid))) == 3

    # a fourth device joins claiming partition 0, which a connected node holds
    newcomer = FIRST_NODE_ID + 3
    grid.node_ids.append(newcomer)
    grid.contexts[newcomer] = Context(
        run_id=1,
        node_id=newcomer,
        node_config={"partition-id": 1, "num-partitions": 3},
        state=RecordDict(),
        run_config=config,
    )
    grid._app = hostile_app({}, {1: {"partition-id": 0}})  # only the newcomer is asked
    with caplog.at_level(logging.WARNING, logger="flwr"):
        messages = list(strategy.configure_train(2, state, ConfigRecord(), grid))

    assert newcomer in nodes.refused and "held by connected node" in nodes.refused[newcomer]
    assert f"node {newcomer} left out" in caplog.text
    trained = {m.metadata.dst_node_id for m in messages}
    assert trained == set(grid.node_ids[:3])  # the run goes on with the three it had
    assert sorted(p.partition_id for p in nodes.profiles.values()) == [0, 1, 2]
    # it is not asked again in later rounds
    before = len(grid.sent)
    list(strategy.configure_train(3, state, ConfigRecord(), grid))
    queries = [m for m in grid.sent[before:] if m.metadata.message_type == MessageType.QUERY]
    assert queries == []

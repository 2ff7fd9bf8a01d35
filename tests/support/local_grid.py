"""An in-process Flower Grid for fast federation tests (no Ray, no SuperLink).

It calls the real ClientApp for every message and round-trips each message and reply through
Flower's protobuf serialisation, as the real transport does. ``reply_hooks`` lets a test make
a node misbehave (return a corrupted reply or none at all) the way a faulty device would.
"""

from __future__ import annotations

import tomllib
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.config import flatten_dict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedapp.apps.client_app import app as client_app
from fedapp.apps.server_app import run_experiment
from fedapp.methods.common.strategy import HeterogeneousStrategy, build_strategy
from fedapp.run.config import RunConfig, fused_run_config, parse_run_config
from fedapp.run.profiles import NodeRegistry

APP_DIR = Path(__file__).resolve().parents[2]
FIRST_NODE_ID = 1001

#: hook(node_index, train reply) -> reply to deliver, or None to lose it (node vanished)
ReplyHook = Callable[[int, Message], Message | None]


def key_of_name(name: str) -> str:
    """A run-config key from a python name: ``learning_rate`` -> ``learning-rate``,
    ``fiarse__grid_points`` -> ``fiarse.grid-points``, ``ditto__lambda`` -> ``ditto.lambda``."""
    return name.replace("__", ".").replace("_", "-")


def run_config(**overrides: Any) -> dict[str, Any]:
    """The app's run config (pyproject defaults) with overrides given as python names
    (:func:`key_of_name`)."""
    return fused_run_config(APP_DIR, {key_of_name(k): v for k, v in overrides.items()})


def preset_overrides(preset: str) -> dict[str, Any]:
    """A shipped preset (``conf/<preset>.toml``) as python-name overrides for ``run_config``."""
    values = flatten_dict(tomllib.loads((APP_DIR / "conf" / f"{preset}.toml").read_text()))
    return {k.replace(".", "__").replace("-", "_"): v for k, v in values.items()}


def server_context(config: dict[str, Any]) -> Context:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    return Context(
        run_id=1, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=config
    )


class LocalGrid(Grid):
    """Grid over ``num_nodes`` simulated nodes served by ``client_app`` in this process."""

    def __init__(
        self,
        client_app: ClientApp,
        config: dict[str, Any],
        num_nodes: int,
        node_configs: list[dict[str, Any]] | None = None,
        reply_hooks: dict[int, ReplyHook] | None = None,
    ) -> None:
        self._app = client_app
        self._run = Run.create_empty(1)
        self._pending: dict[str, Message] = {}
        self.reply_hooks = reply_hooks or {}
        self.node_ids = [FIRST_NODE_ID + i for i in range(num_nodes)]
        node_configs = node_configs or [
            {"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)
        ]
        self.contexts = {
            node_id: Context(
                run_id=1,
                node_id=node_id,
                node_config=node_configs[i],
                state=RecordDict(),
                run_config=config,
            )
            for i, node_id in enumerate(self.node_ids)
        }
        self.sent: list[Message] = []

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(
            content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl
        )

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def get_nodes(self) -> Iterable[Any]:
        return []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            message.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            self.sent.append(message)
            node_id = message.metadata.dst_node_id
            delivered = message_from_proto(message_to_proto(message))
            TaskIdentity.node_id = node_id
            reply = self._app(delivered, self.contexts[node_id])
            TaskIdentity.node_id = SUPERLINK_NODE_ID
            index = node_id - FIRST_NODE_ID
            hook = self.reply_hooks.get(index)
            if hook is not None and message.metadata.message_type == MessageType.TRAIN:
                reply = hook(index, reply)
            if reply is not None:
                self._pending[message.metadata.message_id] = message_from_proto(
                    message_to_proto(reply)
                )
            else:  # the node vanished: it is no longer listed, as the SuperLink would do
                self.node_ids = [n for n in self.node_ids if n != node_id]
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._pending.pop(i) for i in list(message_ids) if i in self._pending]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return list(self.pull_messages(self.push_messages(messages)))


class Federation(NamedTuple):
    """An in-process federation a test drives step by step: the parsed run config, the grid of
    the app's real ClientApp, the profiled nodes and the run's strategy (not yet started)."""

    cfg: RunConfig
    grid: LocalGrid
    nodes: NodeRegistry
    strategy: HeterogeneousStrategy


def local_federation(config: dict[str, Any], num_nodes: int, **grid_options: Any) -> Federation:
    """The set-up of a federation test: server identity, grid, every node profiled, strategy."""
    cfg = parse_run_config(config)
    server_context(config)
    grid = LocalGrid(client_app, config, num_nodes, **grid_options)
    nodes = NodeRegistry(cfg.num_clients)
    nodes.wait_for(grid, num_nodes, timeout=5)
    return Federation(cfg, grid, nodes, build_strategy(cfg, nodes))


def run_local(
    config: dict[str, Any], num_nodes: int, **grid_options: Any
) -> tuple[dict[str, Any], LocalGrid]:
    """A whole run (the ServerApp's logic) on ``num_nodes`` in-process nodes: its summary, and
    the grid (what was sent, each node's context)."""
    server_context(config)
    grid = LocalGrid(client_app, config, num_nodes, **grid_options)
    return run_experiment(grid, parse_run_config(config)), grid


class PowerCut(RuntimeError):
    """The server lost mid-round: raised from a reply hook to cut a run where it stands."""


def crash_in_round(server_round: int) -> Callable[[int, Message], Message]:
    """A reply hook that cuts the run when the first reply of ``server_round`` arrives."""

    def hook(index: int, reply: Message) -> Message:
        if reply.metadata.group_id == str(server_round):
            raise PowerCut(f"server lost in round {server_round}")
        return reply

    return hook

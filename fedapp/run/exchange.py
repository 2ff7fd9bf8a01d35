"""Send messages to nodes and collect their replies without Flower's fixed 3 s wait.

Flower 1.42's ``Grid.send_and_receive`` (the SuperLink's gRPC/HTTP grid) sleeps 3 s between pulls,
so every round pays up to 3 s after the last reply arrived, and it waits for a node that has
vanished until the whole timeout expires. Here the server pushes, then pulls with a short poll
that backs off (``FIRST_POLL`` growing to ``MAX_POLL``, back to ``FIRST_POLL`` when a reply came,
since a round's replies come close together), and stops waiting for a node as soon as
the SuperLink says it is gone: an error reply (``NODE_UNAVAILABLE`` once its heartbeats lapse), or
the node missing from ``grid.get_node_ids()`` (which lists online nodes only). The replies it
returns all come from the nodes themselves; one the SuperLink sent for a departed node is logged.
``PromptGrid`` gives a grid this ``send_and_receive``, for Flower's ``Strategy.start``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from logging import WARNING
from typing import Any

from flwr.app import Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.supercore.run import Run

FIRST_POLL = 0.05  # seconds before the first pull; replies on a LAN come within ~0.1 s of ready
#: The longest wait between pulls, at most this much is added to a round (a round ends on the
#: poll's grid; docs/performance.md measures it); a pull is one small request to the SuperLink.
MAX_POLL = 0.1
BACKOFF = 1.5
#: Flower's simulation engine hands queued messages to its actors in node-registration order,
#: one pass over the nodes every 0.1 s, whatever order they were pushed in; messages pushed this
#: much earlier are handed out one pass earlier, so a round's longest clients start first.
LEAD_GAP = 0.15
MEMBERSHIP_EVERY = 2.0  # seconds between checks that the awaited nodes are still online


def exchange(
    grid: Grid, messages: Iterable[Message], timeout: float, lead: int = 0
) -> list[Message]:
    """Push ``messages``, return every reply that came before ``timeout`` seconds passed or the
    awaited nodes left; a reply may be an error message (the caller decides what it means).
    The first ``lead`` messages go out ``LEAD_GAP`` before the others (see ``LEAD_GAP``)."""
    messages = list(messages)
    if not messages:
        return []
    destinations = [m.metadata.dst_node_id for m in messages]
    pushed = list(grid.push_messages(messages[:lead]))
    if 0 < lead < len(messages):
        time.sleep(LEAD_GAP)
    pushed += list(grid.push_messages(messages[lead:]))
    pending = {mid: node for mid, node in zip(pushed, destinations, strict=True) if mid}
    replies: list[Message] = []
    start = time.monotonic()
    deadline, next_check, delay = start + timeout, start + MEMBERSHIP_EVERY, FIRST_POLL
    while pending:
        pulled = list(grid.pull_messages(list(pending)))
        for reply in pulled:
            node_id = pending.pop(reply.metadata.reply_to_message_id, None)
            if node_id is None:
                continue
            if reply.metadata.src_node_id == SUPERLINK_NODE_ID and reply.has_error():
                # the SuperLink answers for a node it declared offline (NODE_UNAVAILABLE); the
                # reply names the SuperLink as its source, so the caller could not tell whose
                log(WARNING, "node %s is unavailable: %s", node_id, reply.error.reason)
                continue
            replies.append(reply)
        now = time.monotonic()
        if not pending or now >= deadline:
            break
        if now >= next_check:
            _forget_departed(grid, pending)
            next_check = now + MEMBERSHIP_EVERY
            if not pending:
                break
        delay = FIRST_POLL if pulled else min(delay * BACKOFF, MAX_POLL)
        time.sleep(min(delay, deadline - now))
    return replies


def _forget_departed(grid: Grid, pending: dict[str, int]) -> None:
    """Stop waiting for messages whose node is no longer online."""
    online = set(grid.get_node_ids())
    for message_id, node_id in list(pending.items()):
        if node_id not in online:
            log(WARNING, "node %s left the federation; not waiting for its reply", node_id)
            del pending[message_id]


class PromptGrid(Grid):
    """A grid whose ``send_and_receive`` is :func:`exchange` (no fixed wait, departed nodes not
    awaited), pushing the first ``lead`` messages ahead; everything else is the wrapped grid's."""

    def __init__(self, grid: Grid, lead: int = 0) -> None:
        self.grid = grid
        self.lead = lead

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        return exchange(self.grid, messages, math.inf if timeout is None else timeout, self.lead)

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

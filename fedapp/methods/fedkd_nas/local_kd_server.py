"""Local-KD, FedKD-NAS's no-coordination ablation (server side): the teacher's logits once, then
every client trains alone; evaluation and NAS bookkeeping are FedKD-NAS's."""

from __future__ import annotations

from typing import Any

from fedapp.methods.common.reply_validation import ArraySpec, ValidReply
from fedapp.methods.common.strategy import State
from fedapp.methods.fedkd_nas.keys import TARGET
from fedapp.methods.fedkd_nas.server import TEACHER, FedKDNASStrategy
from fedapp.run.config import ConfigError
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeProfile, NodeRegistry


class LocalKDStrategy(FedKDNASStrategy):
    """Local-KD: each client gets P_T once (the first time it is sampled) and then trains alone;
    replies carry no arrays and the server's state never changes."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.delivered: set[int] = set()  # partitions that have received the teacher's logits

    def accounts(self) -> dict[str, Any]:
        """FedKD-NAS's records and the partitions already sent the teacher's logits: a resumed
        run must not send them again (traffic) nor withhold them from a node that never had them."""
        return super().accounts() | {"delivered": sorted(self.delivered)}

    def restore_accounts(self, accounts: dict[str, Any]) -> None:
        super().restore_accounts(accounts)
        if "delivered" not in accounts:
            raise ConfigError(
                "the checkpoint predates Local-KD's record of which nodes hold the teacher's "
                "logits, so a resume would send them again: resume refused, nothing was changed; "
                "start a new run (another 'run-name')"
            )
        self.delivered = {int(p) for p in accounts["delivered"]}

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        if profile.partition_id in self.delivered or TEACHER not in global_state:
            return {}
        self.delivered.add(profile.partition_id)
        return {TARGET: global_state[TEACHER]}

    def expected_reply(self, profile: NodeProfile, payload: State) -> dict[str, ArraySpec]:
        return {}

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        self._log_choices(server_round, replies)
        return global_state

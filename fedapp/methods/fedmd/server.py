"""FedMD server (Li & Wang 2019): the consensus is the unweighted mean of the parties' logits.

The server's state is the last consensus (logits on that round's alignment subset) and the round
whose subset it belongs to; every client receives it and digests it before its revisit and next
upload (fedapp/methods/fedmd/client.py). Round 1 carries a zero placeholder marked round 0 (nothing
to digest yet), so that every message has the same shape; its bytes count in the ledger. Round 1 is
transfer learning plus the first upload, so ``num-server-rounds`` = 1 + the paper's collaboration
rounds.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fedapp.methods.common.client_held import ClientHeldStrategy
from fedapp.methods.common.reply_validation import ArraySpec, ComputeFloor, ValidReply
from fedapp.methods.common.strategy import State
from fedapp.methods.fedmd.keys import CONSENSUS, CONSENSUS_ROUND
from fedapp.methods.fedmd.settings import FedMDSettings
from fedapp.run.profiles import NodeProfile
from fedapp.wire.messages import LOGITS


def consensus(logits: list[np.ndarray]) -> np.ndarray:
    """The parties' unweighted mean (FedMD averages parties, not examples)."""
    return np.mean(np.stack(logits), axis=0, dtype=np.float64).astype(np.float32)


class FedMDStrategy(ClientHeldStrategy):
    """Consensus on a fresh alignment subset each round; clients digest and revisit."""

    def initial_state(self) -> State:
        shape = (self.run.section(FedMDSettings).alignment_size, self.info.num_classes)
        return {
            CONSENSUS: np.zeros(shape, np.float32),
            CONSENSUS_ROUND: np.array(0, dtype=np.int64),
        }

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        return global_state

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """The upload's forward passes over the alignment subset, and once there is a consensus
        the revisit of the shard (a node's first round trains more: transfer learning)."""
        settings = self.run.section(FedMDSettings)
        macs = self.own_model_macs(profile)
        revisit = settings.revisit_epochs if int(self._global[CONSENSUS_ROUND]) > 0 else 0
        return replace(self.training_floor(macs, revisit), fixed=macs * settings.alignment_size)

    def expected_reply(self, profile: NodeProfile, payload: State) -> dict[str, ArraySpec]:
        return {
            LOGITS: ArraySpec(
                (self.run.section(FedMDSettings).alignment_size, self.info.num_classes), "float32"
            )
        }

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        return {
            CONSENSUS: consensus([r.arrays[LOGITS] for r in replies]),
            CONSENSUS_ROUND: np.array(server_round, dtype=np.int64),
        }

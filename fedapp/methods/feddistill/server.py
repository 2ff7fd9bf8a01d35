"""FedDistill server: Jeong et al. 2018 federated distillation of per-label mean logits.

Each client uploads its per-label mean logits; a label's global logit is the unweighted mean over
the clients that saw that label. Two flavours of who counts, by ``feddistill.exclude-own``:
- false (PFLlib): the clients that uploaded in the last completed round; every client receives
  the same global logits;
- true (Jeong et al.'s original, as CGCL-codes/FedGKD): each client receives the mean of every
  OTHER client's latest upload, excluding its own.
The server state keeps every partition's latest upload, so both flavours survive a resume.
"""

from __future__ import annotations

import numpy as np

from fedapp.methods.common.client_held import ClientHeldStrategy
from fedapp.methods.common.reply_validation import ArraySpec, ComputeFloor, ValidReply
from fedapp.methods.common.strategy import State
from fedapp.methods.feddistill.keys import GLOBAL_LOGITS, GLOBAL_PRESENT, LABEL_COUNTS, LABEL_LOGITS
from fedapp.methods.feddistill.settings import FedDistillSettings
from fedapp.run.profiles import NodeProfile

CLIENT_LOGITS = "client-logits"  # (clients, classes, classes): each partition's latest upload
CLIENT_COUNTS = "client-counts"  # (clients, classes): its per-label counts
UPLOAD_ROUND = "upload-round"  # (clients,) int64: round of that upload, 0 = never
LAST_ROUND = "last-round"  # 0-d int64: the last round with an upload


def label_consensus(
    logits: np.ndarray, counts: np.ndarray, contributors: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per label, the unweighted mean of the contributors' mean logits over those that saw it.

    ``logits`` (K, C, C), ``counts`` (K, C), ``contributors`` (K,) bool. Returns the global
    logits (C, C) float32 (zero rows where no contributor saw the label) and the presence mask
    (C,) float32.
    """
    seen = (counts > 0) & contributors[:, None]  # (K, C)
    clients_per_label = seen.sum(axis=0)
    sums = np.einsum("kc,kcd->cd", seen.astype(np.float64), logits.astype(np.float64))
    means = sums / np.maximum(clients_per_label, 1)[:, None]
    return means.astype(np.float32), (clients_per_label > 0).astype(np.float32)


class FedDistillStrategy(ClientHeldStrategy):
    """Per-label logit exchange; no weights travel."""

    def initial_state(self) -> State:
        clients, classes = self.run.rounds.num_clients, self.info.num_classes
        return {
            CLIENT_LOGITS: np.zeros((clients, classes, classes), np.float32),
            CLIENT_COUNTS: np.zeros((clients, classes), np.float32),
            UPLOAD_ROUND: np.zeros(clients, np.int64),
            LAST_ROUND: np.array(0, dtype=np.int64),
        }

    def contributors(self, profile: NodeProfile, state: State) -> np.ndarray:
        """Whose latest uploads make up this node's global logits."""
        uploaded = state[UPLOAD_ROUND]
        if self.run.section(FedDistillSettings).exclude_own:
            mask = uploaded > 0
            mask[profile.partition_id] = False
            return mask
        return (uploaded == state[LAST_ROUND]) & (uploaded > 0)

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        logits, present = label_consensus(
            global_state[CLIENT_LOGITS],
            global_state[CLIENT_COUNTS],
            self.contributors(profile, global_state),
        )
        return {GLOBAL_LOGITS: logits, GLOBAL_PRESENT: present}

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """Local epochs of the node's own model."""
        return self.training_floor(self.own_model_macs(profile))

    def expected_reply(self, profile: NodeProfile, payload: State) -> dict[str, ArraySpec]:
        classes = self.info.num_classes
        return {
            LABEL_LOGITS: ArraySpec((classes, classes), "float32"),
            LABEL_COUNTS: ArraySpec((classes,), "float32"),
        }

    def reference_params(self, global_state: State) -> int:
        """One client's exchange: a (classes x classes) logit table and its mask."""
        return self.info.num_classes * (self.info.num_classes + 1)

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        state = {name: array.copy() for name, array in global_state.items()}
        for reply in replies:
            partition = self.nodes.profiles[reply.node_id].partition_id
            state[CLIENT_LOGITS][partition] = reply.arrays[LABEL_LOGITS]
            state[CLIENT_COUNTS][partition] = reply.arrays[LABEL_COUNTS]
            state[UPLOAD_ROUND][partition] = server_round
        state[LAST_ROUND] = np.array(server_round, dtype=np.int64)
        return state

"""FedMD's message keys. Both halves of the method read them."""

from __future__ import annotations

#: FedMD payload: the last consensus (alignment-size, classes) and its alignment round (0: none).
CONSENSUS = "consensus"
CONSENSUS_ROUND = "consensus-round"

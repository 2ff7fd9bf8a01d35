"""FedDistill's message keys. Both halves of the method read them."""

from __future__ import annotations

#: FedDistill reply: per-label mean logits (classes, classes) and how many logits each averages;
#: payload: the global per-label logits and where one exists (1.0).
LABEL_LOGITS = "label-logits"
LABEL_COUNTS = "label-counts"
GLOBAL_LOGITS = "global-logits"
GLOBAL_PRESENT = "global-present"

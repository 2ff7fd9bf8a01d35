"""FIARSE's message keys. Both halves of the method read them."""

from __future__ import annotations

#: FIARSE: per masked tensor (in masked_names order) keep |w| >= its threshold; effective
#: forward MACs per example of the client's mask.
THRESHOLDS = "mask-thresholds"
MASK_MACS = "mask-macs"

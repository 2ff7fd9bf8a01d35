"""HeteroFL's message keys. Both halves of the method read them."""

from __future__ import annotations

#: HeteroFL: the width a client trains; reply array, 1.0 for each class present in its shard.
WIDTH_KEY = "width"
LABEL_MASK = "label-mask"

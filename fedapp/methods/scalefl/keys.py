"""ScaleFL's message keys. Both halves of the method read them."""

from __future__ import annotations

#: ScaleFL: the depth/width level a client trains.
LEVEL = "level"

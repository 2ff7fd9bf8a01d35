"""FEAST's message keys. Both halves of the method read them."""

from __future__ import annotations

#: FEAST: the cache indices a client affords, and whether it received its routed envelope.
AFFORDABLE = "affordable"
ROUTED = "routed"

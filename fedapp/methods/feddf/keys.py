"""FedDF's message keys. Both halves of the method read them."""

from __future__ import annotations

#: FedDF: the prototype (architecture name) a client trains.
PROTOTYPE = "prototype"

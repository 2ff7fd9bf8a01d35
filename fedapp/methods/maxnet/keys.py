"""SuperFedNAS's and DeepFedNAS's message keys. Both halves of the method read them."""

from __future__ import annotations

#: SuperFedNAS/DeepFedNAS: the assigned subnet's architecture string.
SUBNET = "subnet"

"""The message key Flower's FedProx sets in every training config, read by the client half."""

from __future__ import annotations

#: Weight mu of the proximal term mu / 2 * ||w - w_global||^2 (Flower's own key).
PROXIMAL_MU = "proximal-mu"

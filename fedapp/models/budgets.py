"""What every model space says of a budget it cannot serve: FEAST's cached variants, the
substrates' widths and levels, the logit methods' candidate families."""

from __future__ import annotations


class BudgetError(ValueError):
    """A budget too small for the cheapest model of a space."""

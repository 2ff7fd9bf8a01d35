"""95 % Wilson score intervals of test accuracies, from the number of test images.

A test accuracy measured on n images is a binomial proportion p̂ = correct / n. Its Wilson score
interval is the set of true accuracies p that a two-sided score test at level 5 % does not reject,
|p̂ - p| <= z sqrt(p (1 - p) / n) with z = Φ⁻¹(0.975); solving that quadratic in p gives

    centre = (p̂ + z² / (2n)) / (1 + z² / n)
    half   = z / (1 + z² / n) · sqrt(p̂ (1 - p̂) / n + z² / (4n²))
    [low, high] = [centre - half, centre + half]

Unlike the normal (Wald) interval p̂ ± z sqrt(p̂ (1 - p̂) / n), it never leaves [0, 1] and does not
collapse to a point at p̂ = 0 or 1, where the accuracies of easy tasks and of failed models lie.

Means over models. Some figures fedapp reports are means, over clients, of accuracies measured on
the same n test images (population accuracy, the mean of the clients' own models). Such a mean
equals the mean over the n images of each image's share of correct models, a value in [0, 1]; a
variable in [0, 1] with mean p has variance at most p (1 - p) (equal when the models err on the
same images), so the Wilson interval at n is a conservative 95 % interval for it: at least as wide
as one that knew how the models' errors overlap. The population is every client, not a sample,
so the test images are the only source of chance. This does not hold for a figure chosen *on* the
test set (the most accurate affordable point per client, the FEAST authors' rule): its maximum is
biased upwards by the selection, which an interval around it would not show, so it gets none.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from fedapp.wire.messages import ACCURACY, NUM_EXAMPLES

#: Φ⁻¹(0.975): the standard normal quantile of a two-sided 95 % interval.
Z95 = 1.959963984540054
#: Column names of an accuracy's interval bounds in CSV files and result rows.
LOW, HIGH = "ci95_low", "ci95_high"
#: Suffix of a summary key that holds ``[low, high]`` of the accuracy under the key before it.
SUMMARY_SUFFIX = "_ci95"


def wilson_interval(accuracy: float, n: int, z: float = Z95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval of an accuracy (a fraction in [0, 1], not a count
    of correct images) measured on ``n`` images; ``z`` = 1.96 gives the 95 % interval."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"an accuracy's interval needs n >= 1 test images, got n = {n!r}")
    if not 0.0 <= accuracy <= 1.0:  # also rejects NaN
        raise ValueError(f"accuracy must be a fraction in [0, 1], got {accuracy!r}")
    if z <= 0:
        raise ValueError(f"z must be > 0, got {z!r}")
    shrink = 1.0 + z * z / n
    centre = (accuracy + z * z / (2 * n)) / shrink
    half = z / shrink * math.sqrt(accuracy * (1.0 - accuracy) / n + z * z / (4 * n * n))
    # p̂ = 0 and p̂ = 1 give centre - half = 0 and centre + half = 1 exactly, but for rounding.
    low = 0.0 if accuracy == 0 else max(0.0, centre - half)
    high = 1.0 if accuracy == 1 else min(1.0, centre + half)
    return low, high


def interval_columns(accuracy: float, n: int) -> dict[str, float]:
    """``ci95_low`` and ``ci95_high`` of an accuracy measured on ``n`` images (CSV columns)."""
    low, high = wilson_interval(accuracy, n)
    return {LOW: low, HIGH: high}


def with_interval(row: Mapping[str, Any], n: int | None = None) -> dict[str, Any]:
    """A result row with the interval of its ``accuracy`` appended; ``n`` defaults to the row's
    own ``num-examples`` (each client's evaluation reports how many images it measured)."""
    images = int(row[NUM_EXAMPLES]) if n is None else n
    return dict(row) | interval_columns(row[ACCURACY], images)


def row_interval(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """A row's (ci95_low, ci95_high), or None where it has none (an accuracy that is not a
    finite number)."""
    if row.get(LOW) is None or row.get(HIGH) is None:
        return None
    return float(row[LOW]), float(row[HIGH])


def is_interval_key(key: str) -> bool:
    """Whether a summary key holds an accuracy that gets an interval: every test accuracy (keys
    ending in ``test_accuracy``) and population accuracy; not the validation accuracy nor
    ``population_accuracy_best_affordable`` (chosen on the test set: see the module text)."""
    return key.endswith("test_accuracy") or key == "population_accuracy"


def summary_intervals(summary: Mapping[str, Any], test_images: int) -> dict[str, Any]:
    """``test_images`` and ``<key>_ci95 = [low, high]`` for every accuracy of a summary that
    :func:`is_interval_key` names and that holds a finite number (a missing teacher's is None,
    a mean over no answering client NaN: neither has an interval)."""
    found: dict[str, Any] = {"test_images": test_images}
    for key, value in summary.items():
        if not is_interval_key(key) or isinstance(value, bool):
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            found[key + SUMMARY_SUFFIX] = list(wilson_interval(float(value), test_images))
    return found


def format_accuracy(accuracy: float, interval: Sequence[float] | None) -> str:
    """``96.90% [96.53, 97.24]``: an accuracy and its interval in percent (no interval known:
    the accuracy alone)."""
    text = f"{100 * accuracy:.2f}%"
    if interval is None:
        return text
    low, high = interval
    return f"{text} [{100 * low:.2f}, {100 * high:.2f}]"


def format_row(row: Mapping[str, Any]) -> str:
    """A result row's ``accuracy`` with its interval, as :func:`format_accuracy`."""
    return format_accuracy(row[ACCURACY], row_interval(row))


def format_measured(accuracy: float, n: int) -> str:
    """An accuracy measured on ``n`` images with its interval, as :func:`format_accuracy` (NaN,
    a mean over no answering client, is printed as it is)."""
    finite = math.isfinite(accuracy)
    return format_accuracy(accuracy, wilson_interval(accuracy, n) if finite else None)

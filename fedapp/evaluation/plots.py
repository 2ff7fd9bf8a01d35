"""The PNG figures of a run (headless: the Agg backend, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _line_plot(
    path: Path,
    x: Sequence[float],
    y_percent: Sequence[float],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    label: str,
    reference: tuple[float, str] | None = None,
    shadow: tuple[Sequence[float], str] | None = None,
) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(x, y_percent, marker="o", label=label)
    if shadow is not None:  # the same points at other x values (e.g. nominal MACs)
        ax.plot(shadow[0], y_percent, marker="o", mfc="none", ls=":", color="gray", label=shadow[1])
    if reference is not None:
        ax.axhline(reference[0], color="gray", linestyle="--", label=reference[1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_rounds(path: Path, rows: Sequence[Mapping[str, Any]], key: str, title: str) -> Path:
    """A per-round metric in [0, 1] (e.g. validation accuracy) as a percentage curve."""
    rows = [r for r in rows if key in r]
    return _line_plot(
        path,
        [r["round"] for r in rows],
        [100 * r[key] for r in rows],
        xlabel="round",
        ylabel="accuracy (%)",
        title=title,
        label=key.replace("-", " "),
    )


def plot_accuracy_vs_macs(
    path: Path, variants: Sequence[Mapping[str, Any]], title: str, population: float | None = None
) -> Path:
    """Test accuracy of every operating point against its MACs as built (and population
    accuracy); where a cache states other (nominal) MACs, the same points there, hollow."""
    reference = None
    if population is not None:
        reference = (100 * population, f"population accuracy {100 * population:.2f}%")
    nominal = [v.get("nominal_macs", v["macs"]) / 1e6 for v in variants]
    built = [v["macs"] / 1e6 for v in variants]
    return _line_plot(
        path,
        built,
        [100 * v["accuracy"] for v in variants],
        xlabel="MACs as built (millions)",
        ylabel="test accuracy (%)",
        title=title,
        label="operating points",
        reference=reference,
        shadow=(nominal, "at the cache's nominal MACs") if nominal != built else None,
    )


def plot_methods_accuracy_vs_macs(
    path: Path,
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    single: Mapping[str, float],
    title: str,
) -> Path:
    """Every method's operating points (test accuracy against MACs) in one figure; methods
    without operating points (one model per client) appear as horizontal reference lines."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, variants in curves.items():
        if variants:
            points = sorted(variants, key=lambda v: v["macs"])
            ax.plot(
                [v["macs"] / 1e6 for v in points],
                [100 * v["accuracy"] for v in points],
                marker="o",
                markersize=3,
                label=name,
            )
    for name, accuracy in single.items():
        ax.axhline(100 * accuracy, linestyle=":", linewidth=1, color="gray")
        ax.annotate(name, (0, 100 * accuracy), xycoords=("axes fraction", "data"), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("MACs (millions, log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path

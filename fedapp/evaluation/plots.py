"""The PNG figures of a run (headless: the Agg backend, no display needed).

matplotlib is imported when a figure is drawn (on the server, once per run), not with this module:
client code reaches it through shared modules, and it costs a device ~0.5 s per ClientApp start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(x, y_percent, marker="o", label=label)
    if reference is not None:
        ax.axhline(reference[0], color="gray", linestyle="--", label=reference[1])
    return _finish(plt, fig, ax, path, xlabel, ylabel, title)


def _finish(plt: Any, fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """Axis labels, title, grid and legend of a single-panel figure; save it and close it."""
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


def _trained(point: Mapping[str, Any]) -> bool:
    """Whether some client trained the point directly (rows without the key: yes)."""
    return bool(point.get("trained", True))


HOLLOW_LABEL = "hollow: no client trained it"


def _points(ax: Any, points: Sequence[Mapping[str, Any]], label: str, markersize: float) -> bool:
    """A method's operating points as one line; trained points filled, untrained ones hollow
    (returns whether there were any)."""
    points = sorted(points, key=lambda v: v["macs"])
    x = [v["macs"] / 1e6 for v in points]
    y = [100 * v["accuracy"] for v in points]
    (line,) = ax.plot(x, y, label=label)
    for trained in (True, False):
        chosen = [i for i, v in enumerate(points) if _trained(v) == trained]
        if chosen:
            ax.plot(
                [x[i] for i in chosen],
                [y[i] for i in chosen],
                linestyle="none",
                marker="o",
                markersize=markersize,
                color=line.get_color(),
                markerfacecolor=line.get_color() if trained else "white",
            )
    return any(not _trained(v) for v in points)


def _hollow_legend(ax: Any) -> None:
    ax.plot(
        [],
        [],
        linestyle="none",
        marker="o",
        color="gray",
        markerfacecolor="white",
        label=HOLLOW_LABEL,
    )


def plot_accuracy_vs_macs(
    path: Path, variants: Sequence[Mapping[str, Any]], title: str, population: float | None = None
) -> Path:
    """Test accuracy of every operating point against its MACs as built (and population
    accuracy); points no client trained directly are drawn hollow; where a cache states other
    (nominal) MACs, the same accuracies are also drawn there (grey crosses)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    if _points(ax, variants, "operating points", 6):
        _hollow_legend(ax)
    ordered = sorted(variants, key=lambda v: v["macs"])
    nominal = [v.get("nominal_macs", v["macs"]) for v in ordered]
    if nominal != [v["macs"] for v in ordered]:
        ax.plot(
            [m / 1e6 for m in nominal],
            [100 * v["accuracy"] for v in ordered],
            marker="x",
            linestyle=":",
            color="gray",
            label="at the cache's nominal MACs",
        )
    if population is not None:
        ax.axhline(
            100 * population,
            color="gray",
            linestyle="--",
            label=f"population accuracy {100 * population:.2f}%",
        )
    return _finish(plt, fig, ax, path, "MACs as built (millions)", "test accuracy (%)", title)


def plot_methods_accuracy_vs_macs(
    path: Path,
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    single: Mapping[str, float],
    title: str,
) -> Path:
    """Every method's operating points (test accuracy against MACs) in one figure, points no
    client trained hollow; methods without operating points (one model per client) appear as
    horizontal reference lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    hollow = False
    for name, variants in curves.items():
        if variants:
            hollow = _points(ax, variants, name, 4) or hollow
    if hollow:
        _hollow_legend(ax)
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


def plot_method_means(path: Path, results: Mapping[str, tuple[float, float]], title: str) -> Path:
    """One bar per method: mean accuracy in [0, 1] with its standard deviation as error bar."""
    names = list(results)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.bar(
        names,
        [100 * results[n][0] for n in names],
        yerr=[100 * results[n][1] for n in names],
        capsize=4,
        color="tab:blue",
        alpha=0.8,
    )
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path

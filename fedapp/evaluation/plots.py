"""The PNG figures of a run (headless: the Agg backend, no display needed).

matplotlib is imported when a figure is drawn (on the server, once per run), not with this module:
client code reaches it through shared modules, it costs a device ~0.5 s per ClientApp start, and
it comes with the ``data`` extra, which a server installs and a device with its own files need not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedapp.data.extras import DATA, needs_extra
from fedapp.evaluation.intervals import format_accuracy, row_interval

#: Percentage points kept below the lowest interval bound (and above the highest).
AXIS_MARGIN = 2.0
#: The accuracy axis ends on multiples of this many percentage points.
AXIS_STEP = 5.0


def _pyplot() -> Any:
    with needs_extra(DATA, "drawing a run's figures"):
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


def accuracy_axis_limits(spans: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Limits (in %) of an accuracy axis that shows every interval ``(low, high)`` (in %) with a
    margin: the lowest bound minus 2 points, down to a multiple of 5, and the highest plus 2, up
    to one (at most 100). Zooming to the points alone would stretch differences within the
    intervals' noise to the whole height of the figure."""
    spans = [(lo, hi) for lo, hi in spans if math.isfinite(lo) and math.isfinite(hi)]
    if not spans:
        return 0.0, 100.0
    low = min(lo for lo, _ in spans) - AXIS_MARGIN
    high = max(hi for _, hi in spans) + AXIS_MARGIN
    bottom = max(0.0, AXIS_STEP * math.floor(low / AXIS_STEP))
    top = min(100.0, AXIS_STEP * math.ceil(high / AXIS_STEP))
    return bottom, max(top, bottom + AXIS_STEP)


def _span(accuracy: float, interval: Sequence[float] | None) -> tuple[float, float]:
    """An accuracy's interval in %, or the accuracy itself where none is known."""
    low, high = (accuracy, accuracy) if interval is None else interval
    return 100 * low, 100 * high


def _point_spans(points: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    return [_span(v["accuracy"], row_interval(v)) for v in points]


def _trained(point: Mapping[str, Any]) -> bool:
    """Whether some client trained the point directly (rows without the key: yes)."""
    return bool(point.get("trained", True))


HOLLOW_LABEL = "hollow: no client trained it"


def _points(ax: Any, points: Sequence[Mapping[str, Any]], label: str, markersize: float) -> bool:
    """A method's operating points as one line, each with its 95 % interval as an error bar
    (where the point has one); trained points filled, untrained ones hollow (returns whether
    there were any)."""
    points = sorted(points, key=lambda v: v["macs"])
    x = [v["macs"] / 1e6 for v in points]
    y = [100 * v["accuracy"] for v in points]
    (line,) = ax.plot(x, y, label=label)
    bars = [
        (i, _span(v["accuracy"], row_interval(v))) for i, v in enumerate(points) if row_interval(v)
    ]
    if bars:
        ax.errorbar(
            [x[i] for i, _ in bars],
            [y[i] for i, _ in bars],
            yerr=[[y[i] - low for i, (low, _) in bars], [high - y[i] for i, (_, high) in bars]],
            linestyle="none",
            color=line.get_color(),
            elinewidth=1,
            capsize=3,
            alpha=0.8,
        )
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
    path: Path,
    variants: Sequence[Mapping[str, Any]],
    title: str,
    population: float | None = None,
    population_interval: Sequence[float] | None = None,
) -> Path:
    """Test accuracy of every operating point, with its 95 % interval, against its MACs as built
    (and population accuracy, its interval shaded); points no client trained directly are drawn
    hollow; where a cache states other (nominal) MACs, the same accuracies are also drawn there
    (grey crosses). The accuracy axis shows every interval (:func:`accuracy_axis_limits`)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    spans = _point_spans(variants)
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
            label=f"population accuracy {format_accuracy(population, population_interval)}",
        )
        spans.append(_span(population, population_interval))
        if population_interval is not None:
            ax.axhspan(*spans[-1], color="gray", alpha=0.12, linewidth=0)
    ax.set_ylim(*accuracy_axis_limits(spans))
    return _finish(plt, fig, ax, path, "MACs as built (millions)", "test accuracy (%)", title)


def plot_methods_accuracy_vs_macs(
    path: Path,
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    single: Mapping[str, float],
    title: str,
    single_intervals: Mapping[str, Sequence[float] | None] | None = None,
) -> Path:
    """Every method's operating points (test accuracy against MACs, 95 % intervals as error
    bars) in one figure, points no client trained hollow; methods without operating points (one
    model per client) appear as horizontal reference lines, their intervals (``single_intervals``,
    where known) shaded. The accuracy axis shows every interval (:func:`accuracy_axis_limits`)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    hollow = False
    spans = []
    for name, variants in curves.items():
        if variants:
            hollow = _points(ax, variants, name, 4) or hollow
            spans += _point_spans(variants)
    if hollow:
        _hollow_legend(ax)
    # labels alternate between the left and right edge in accuracy order, so that methods a
    # point or two apart stay readable
    ranked = sorted(single.items(), key=lambda item: item[1])
    for rank, (name, accuracy) in enumerate(ranked):
        interval = (single_intervals or {}).get(name)
        ax.axhline(100 * accuracy, linestyle=":", linewidth=1, color="gray")
        if interval is not None:
            ax.axhspan(*_span(accuracy, interval), color="gray", alpha=0.08, linewidth=0)
        edge, align = (0, "left") if rank % 2 == 0 else (1, "right")
        label = f"{name} {100 * accuracy:.1f} %"
        coordinates = ("axes fraction", "data")
        ax.annotate(label, (edge, 100 * accuracy), xycoords=coordinates, fontsize=7, ha=align)
        spans.append(_span(accuracy, interval))
    ax.set_ylim(*accuracy_axis_limits(spans))
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


def plot_methods_rounds(
    path: Path,
    curves: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    x_label: str = "round",
    target: float | None = None,
    bands: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> Path:
    """One line per method: an accuracy in [0, 1] (validation) against the round, or against
    another axis (``x_label``: the fleet's hours); ``bands`` shade each point's interval,
    ``target`` draws that accuracy as a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, points in curves.items():
        xs = [r for r, _ in points]
        (line,) = ax.plot(xs, [100 * a for _, a in points], marker="o", label=name)
        if bands and name in bands:
            low, high = zip(*bands[name], strict=True)
            ax.fill_between(
                xs, [100 * v for v in low], [100 * v for v in high], color=line.get_color(),
                alpha=0.15, linewidth=0,
            )  # fmt: skip
    if target is not None:
        ax.axhline(100 * target, color="grey", linestyle="--", linewidth=1, label="target")
    return _finish(plt, fig, ax, path, x_label, "validation accuracy (%)", title)

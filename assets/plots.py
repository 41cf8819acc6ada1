"""Plots and tables for asset metadata: what the Dagster UI shows a person instead of a JSON blob.

A plot is a PNG drawn with matplotlib's object API (no pyplot, so no display and no global state; the Agg
canvas is all it needs) and embedded in a Markdown metadata value as a base64 data URI, which the UI renders
as an image: `![title](data:image/png;base64,...)`. Tables use Dagster's own table metadata type, so the
UI can sort them. matplotlib is imported when a plot is drawn, not when the definitions load.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

# Small enough to keep each materialization event a few tens of KB in the event log, large enough to read.
FIGSIZE = (6.4, 3.2)
DPI = 80


def bar_chart(counts: Mapping[str, float], *, title: str, ylabel: str, log: bool = False) -> MetadataValue:
    """One bar per key, in the mapping's order; the value is printed on each bar."""
    if not counts:
        return MetadataValue.md(f"**{title}**: nothing to plot")
    figure = _figure()
    axes = figure.add_subplot()
    labels, values = [str(k) for k in counts], list(counts.values())
    bars = axes.bar(range(len(values)), values, color="#4f6bed")
    axes.bar_label(bars, labels=[_short(v) for v in values], fontsize=7)
    axes.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center", fontsize=8)
    axes.set_ylabel(ylabel)
    axes.margins(y=0.12)  # room for the value labels above the bars
    if log:
        axes.set_yscale("log")
    return _markdown(figure, title)


def grouped_bar_chart(groups: Mapping[str, Mapping[str, float]], *, title: str, ylabel: str,
                      errors: Mapping[str, Mapping[str, float]] | None = None) -> MetadataValue:
    """One group of bars per key of {group: {series: value}} (a task's score at each stage), one colour per series,
    in first-seen order; `errors` (same shape) draws ± error bars (a standard error)."""
    series = list(dict.fromkeys(name for values in groups.values() for name in values))
    if not series:
        return MetadataValue.md(f"**{title}**: nothing to plot")
    figure = _figure()
    axes = figure.add_subplot()
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g, values in enumerate(groups.values()) if name in values]
        ys = [values[name] for values in groups.values() if name in values]
        yerr = None
        if errors is not None:
            yerr = [errors.get(group, {}).get(name, 0.0) for group, values in groups.items() if name in values]
        axes.bar(xs, ys, width=width, yerr=yerr, capsize=2, label=name)
    axes.set_xticks(range(len(groups)), list(groups), rotation=30 if len(groups) > 4 else 0,
                    ha="right" if len(groups) > 4 else "center", fontsize=8)
    axes.set_ylabel(ylabel)
    axes.legend(fontsize=8)
    return _markdown(figure, title)


def histogram(counts: Mapping[int, int], *, title: str, xlabel: str, ylabel: str = "count", log: bool = True) -> MetadataValue:
    """Already-binned integer data ({value: how many}, e.g. cluster size -> clusters) as bars on a numeric axis."""
    if not counts:
        return MetadataValue.md(f"**{title}**: nothing to plot")
    figure = _figure()
    axes = figure.add_subplot()
    xs = sorted(int(x) for x in counts)
    ys = [counts[x] if x in counts else counts[str(x)] for x in xs]
    axes.bar(xs, ys, width=0.8, color="#4f6bed")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if log:
        axes.set_yscale("log")
    if len(xs) <= 20:
        axes.set_xticks(xs)
    return _markdown(figure, title)


def line_chart(points: list[tuple[float, float]] | Mapping[str, list[tuple[float, float]]], *, title: str, xlabel: str,
               ylabel: str, log: bool = False) -> MetadataValue:
    """A curve over (x, y) points, e.g. the loss by step of a training stage; or one labelled curve per key of
    {label: points} (zero-shot accuracy by task)."""
    series = points if isinstance(points, Mapping) else {None: points}
    series = {label: curve for label, curve in series.items() if curve}
    if not series:
        return MetadataValue.md(f"**{title}**: nothing to plot")
    figure = _figure()
    axes = figure.add_subplot()
    for label, curve in series.items():
        xs, ys = zip(*curve)
        axes.plot(xs, ys, color="#4f6bed" if label is None else None, linewidth=1.5,
                  marker="." if len(xs) <= 50 else None, label=label)
    if None not in series:
        axes.legend(fontsize=8)
    _label(axes, xlabel, ylabel, logy=log)
    return _markdown(figure, title)


def scatter_chart(series: Mapping[str, list[tuple[float, float]]], *, lines: Mapping[str, list[tuple[float, float]]] = {},
                  title: str, xlabel: str, ylabel: str, logx: bool = False) -> MetadataValue:
    """Measured points, one marked series per key (joined by a thin line), and fitted curves over them as lines
    (a curve of one point is a star): e.g. each model size's loss against compute, and a scaling law's frontier."""
    series = {label: points for label, points in series.items() if points}
    lines = {label: curve for label, curve in lines.items() if curve}
    if not series and not lines:
        return MetadataValue.md(f"**{title}**: nothing to plot")
    figure = _figure()
    axes = figure.add_subplot()
    for label, points in series.items():
        xs, ys = zip(*points)
        axes.plot(xs, ys, marker="o", markersize=4, linewidth=0.6, label=label)
    for label, curve in lines.items():
        xs, ys = zip(*curve)
        if len(xs) == 1:
            axes.plot(xs, ys, marker="*", markersize=11, linestyle="none", color="black", label=label)
        else:
            axes.plot(xs, ys, linestyle="--", linewidth=1.2, color="black", label=label)
    axes.legend(fontsize=6, ncol=2)
    _label(axes, xlabel, ylabel, logx=logx)
    return _markdown(figure, title)


def count_table(counts: Mapping[str, int | float], *, key: str, value: str) -> MetadataValue:
    """{label: number} as a two-column table, largest first."""
    rows = sorted(counts.items(), key=lambda item: (-item[1], str(item[0])))
    schema = TableSchema(columns=[TableColumn(key, "string"), TableColumn(value, "float" if _any_float(counts) else "int")])
    return MetadataValue.table([TableRecord({key: str(k), value: v}) for k, v in rows], schema=schema)


def _figure():
    from matplotlib.figure import Figure

    return Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")


def _label(axes, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False) -> None:
    """The curve plots' axes: labels, a light grid, log scales where asked."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if logx:
        axes.set_xscale("log")
    if logy:
        axes.set_yscale("log")


def _markdown(figure, title: str) -> MetadataValue:
    figure.suptitle(title, fontsize=10)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return MetadataValue.md(f"![{title}](data:image/png;base64,{data})")


def _short(value: float) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    value = int(value)
    return f"{value / 1e6:.1f}M" if value >= 1_000_000 else f"{value / 1e3:.1f}k" if value >= 10_000 else str(value)


def _any_float(counts: Mapping) -> bool:
    return any(isinstance(v, float) for v in counts.values())

"""Seaborn figures for the report, each returned as a `data:image/svg+xml;base64,...` URI.

An SVG inside `<img>` is inert (no scripts, no shared ids between figures), stays sharp at any
width, and needs no network; its text uses the viewer's local sans-serif fonts (nothing is fetched:
the page's CSP blocks it). Each function returns
None when it has nothing to draw, and the page then says so instead of showing an empty plot.
"""

from __future__ import annotations

import base64
import io
import re

import matplotlib

matplotlib.use("Agg")  # no display, ever: the report runs headless and in CI

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis.report.axes import declutter, legend_outside, tidy, time_unit  # noqa: E402

__all__ = [
    "accuracy_figure",
    "comm_figure",
    "environment_figure",
    "memory_figure",
    "phases_figure",
    "speedup_figure",
    "step_times_figure",
    "summary_figure",
]

_COORD = re.compile(rb"(?<![\d.])(\d{2,}\.\d)\d+")
# Text stays <text> (a third of the page weight of glyph paths, and tests can measure the labels
# in a browser). DejaVu Sans first: matplotlib lays the labels out with it and the browser draws
# them with it where installed; the fallbacks are narrower, so labels never grow into each other.
RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "dpscope",
    "figure.dpi": 100,
    "font.sans-serif": ["DejaVu Sans", "Liberation Sans", "Arial", "Helvetica"],
}
MIB = 2**20


def png_uri(fig: plt.Figure) -> str:
    for ax in fig.axes:  # every figure: ≤ 8 ticks with thousands separators per numeric axis
        tidy(ax)
    declutter(fig)  # and fewer where its labels would still touch
    buf = io.BytesIO()
    none = dict.fromkeys(("Date", "Creator", "Format", "Type"))  # no per-figure metadata block
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata=none)
    plt.close(fig)
    # Coordinates of 10 px and more keep one decimal (0.1 px cannot be seen); small numbers (glyph
    # scales, opacities) stay exact. A 100-run report's figures are about a fifth lighter.
    svg = _COORD.sub(rb"\1", buf.getvalue())
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")


def theme() -> None:
    sns.set_theme(style="whitegrid", context="notebook", rc=RC)


def _themed(df: pd.DataFrame, *required: str) -> pd.DataFrame | None:
    """`df` less the rows missing a `required` column, with the theme set; None when nothing is
    left to draw (the page then says so)."""
    df = df.dropna(subset=list(required)) if required else df
    if df.empty:
        return None
    theme()
    return df


def figure_height(n_rows: int) -> float:
    return min(2.0 + 0.38 * n_rows, 14.0)


def _min_span(ax: plt.Axes, values: pd.Series, span: float) -> None:
    """Show at least `span` around the data: identical runs would otherwise get a 1e-7 axis."""
    lo, hi = float(values.min()), float(values.max())
    if hi - lo < span:
        mid = (hi + lo) / 2
        ax.set_ylim(mid - span, mid + span)
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")


def summary_figure(runs: pd.DataFrame, *, by_group: bool = False) -> str | None:
    """Throughput per run (samples/s), coloured by mode; with `by_group`, one bar per group of
    seeds (mean, error bar = std over seeds) so a 100-run sweep stays a readable figure."""
    if (df := _themed(runs, "samples_per_s")) is None:
        return None
    y = "group" if by_group else "label"
    fig, ax = plt.subplots(figsize=(8, figure_height(df[y].nunique())))
    sns.barplot(
        data=df, x="samples_per_s", y=y, hue="mode", dodge=False, errorbar="sd", capsize=0.2, ax=ax
    )
    ax.set(xlabel="throughput (samples/s)", ylabel="")
    legend_outside(ax, title="mode")
    return png_uri(fig)


def speedup_figure(runs: pd.DataFrame) -> str | None:
    """Throughput and speedup vs world size, ideal linear line, error bars = std over seeds."""
    if (df := _themed(runs, "samples_per_s", "world_size")) is None:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    # One line per series over world size; error bars = standard deviation over seeds.
    per_size = dict(x="world_size", hue="series", marker="o", errorbar="sd", err_style="bars")
    sns.lineplot(data=df, y="samples_per_s", ax=a1, **per_size)
    a1.set(xlabel="world size (ranks)", ylabel="throughput (samples/s)", title="Throughput")
    sp = df.dropna(subset=["speedup"])
    top = max(df["world_size"].max(), 2)
    a2.plot([1, top], [1, top], ls="--", color="0.5", label="ideal (linear)")
    if not sp.empty:
        sns.lineplot(data=sp, y="speedup", ax=a2, **per_size)
    a2.set(xlabel="world size (ranks)", ylabel="speedup vs single (×)", title="Speedup")
    for ax in (a1, a2):
        ax.xaxis.get_major_locator().set_params(integer=True)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    legend_outside(a2)  # one legend for both panels (a2 also has the ideal line), beside them
    fig.tight_layout()
    return png_uri(fig)


STEP_BAR_SEGMENTS = [
    ("data_s", "data wait"),
    ("forward_s", "forward"),
    ("backward_compute_s", "backward"),
    ("exposed_comm_s", "exposed comm"),
    ("optimizer_s", "optimizer"),
    ("other_s", "other"),
]


def phases_figure(phases: pd.DataFrame) -> str | None:
    """Stacked per-step time per run and rank, in µs, ms or s by magnitude."""
    if _themed(phases) is None:
        return None
    df = phases.set_index("bar")[[k for k, _ in STEP_BAR_SEGMENTS]].fillna(0.0) * 1e6  # µs
    unit, per = time_unit(float(df.sum(axis=1).max()))
    df = df / per
    df.columns = [name for _, name in STEP_BAR_SEGMENTS]
    fig, ax = plt.subplots(figsize=(9, figure_height(len(df))))
    df.iloc[::-1].plot.barh(
        stacked=True, ax=ax, color=sns.color_palette("deep", len(STEP_BAR_SEGMENTS)), width=0.7
    )
    ax.set(xlabel=f"time per step ({unit})", ylabel="")
    legend_outside(ax)
    return png_uri(fig)


TB = [
    ("tb_computation", "computation"),
    ("tb_overlapping", "overlapping"),
    ("tb_communication", "communication"),
    ("tb_other", "other"),
]


def comm_figure(overlap: pd.DataFrame, collectives: pd.DataFrame) -> str | None:
    """Top: tb-profiler split per rank (µs/step). Bottom: sync vs transfer per collective (µs)."""
    has_tb = not overlap.empty and overlap[[k for k, _ in TB]].notna().any().any()
    panels = [p for p, ok in (("tb", has_tb), ("coll", not collectives.empty)) if ok]
    if not panels:
        return None
    theme()
    sizes = {"tb": len(overlap), "coll": len(collectives)}
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(9, sum(figure_height(sizes[p]) for p in panels)),
        height_ratios=[sizes[p] + 2 for p in panels],
        squeeze=False,
    )
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        if panel == "tb":
            df = overlap.set_index("bar")[[k for k, _ in TB]].fillna(0.0)
            df.columns = [name for _, name in TB]
            colors, title, xlabel = (
                sns.color_palette("muted", 4),
                "tb-profiler split per rank (tb-profiler's rules, not dpscope's)",
                "per-step time",
            )
        else:
            df = collectives.set_index("bar")[["transfer_us_total", "sync_us_total"]].fillna(0.0)
            df.columns = ["transfer", "sync wait"]
            colors, title, xlabel = (
                sns.color_palette("pastel", 2),
                "Collectives: sync wait vs transfer",
                "total time",
            )
        unit, per = time_unit(float(df.sum(axis=1).max()))  # the frames hold µs
        (df / per).iloc[::-1].plot.barh(stacked=True, ax=ax, color=colors, width=0.7)
        ax.set(xlabel=f"{xlabel} ({unit})", ylabel="", title=title)
        legend_outside(ax)
    fig.tight_layout()
    return png_uri(fig)


def memory_figure(memory: pd.DataFrame) -> str | None:
    """Peak allocated / reserved / RSS (MiB) per run, rank and device."""
    cols = {
        "peak_allocated_bytes": "peak allocated",
        "peak_reserved_bytes": "peak reserved",
        "peak_rss_bytes": "peak RSS",
    }
    if memory.empty:
        return None
    long = memory.melt(
        id_vars=["bar"], value_vars=list(cols), var_name="metric", value_name="bytes"
    )
    if (long := _themed(long, "bytes")) is None:
        return None
    long = long.assign(MiB=long["bytes"].astype(float) / MIB, metric=long["metric"].map(cols))
    fig, ax = plt.subplots(
        figsize=(9, figure_height(len(memory) * max(long["metric"].nunique(), 1) / 1.5))
    )
    sns.barplot(data=long, x="MiB", y="bar", hue="metric", ax=ax)
    ax.set(xlabel="memory (MiB)", ylabel="")
    legend_outside(ax)
    return png_uri(fig)


def accuracy_figure(runs: pd.DataFrame) -> str | None:
    """Top-1 and test loss per mode; error bars = std over seeds."""
    if (df := _themed(runs, "top1_pct")) is None:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    # Points, not bars: accuracy differences of a point or two vanish on a 0-based bar axis.
    kw = {
        "x": "series",
        "errorbar": "sd",
        "hue": "series",
        "legend": False,
        "linestyle": "none",
        "capsize": 0.15,
    }
    sns.pointplot(data=df, y="top1_pct", ax=a1, **kw)
    a1.set(xlabel="", ylabel="top-1 (%)", title="Top-1 accuracy")
    sns.pointplot(data=df, y="test_loss", ax=a2, **kw)
    _min_span(a1, df["top1_pct"], 1.0)
    _min_span(a2, df["test_loss"], 0.01 * max(abs(df["test_loss"].max()), 1e-3))
    a2.set(xlabel="", ylabel="test loss (nats)", title="Test loss")
    for ax in (a1, a2):
        ax.tick_params(axis="x", rotation=20)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    fig.tight_layout()
    return png_uri(fig)


def environment_figure(runs: pd.DataFrame) -> str | None:
    """Throughput by platform, side by side per backend/mode."""
    if (df := _themed(runs, "samples_per_s")) is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.6))
    sns.barplot(data=df, x="os", y="samples_per_s", hue="series", errorbar="sd", ax=ax)
    ax.set(xlabel="platform", ylabel="throughput (samples/s)")
    legend_outside(ax)
    return png_uri(fig)


def step_times_figure(steps: pd.DataFrame) -> str | None:
    """Time of every profiled step (µs, ms or s by magnitude), one line per run and rank."""
    if _themed(steps) is None:
        return None
    unit, per = time_unit(float(steps["step_time_ms"].max()) * 1e3)
    steps = steps.assign(step_time=steps["step_time_ms"] * 1e3 / per)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    sns.lineplot(data=steps, x="step", y="step_time", hue="bar", marker="o", ax=ax)
    ax.set(xlabel="profiler step", ylabel=f"step time ({unit})")
    ax.xaxis.get_major_locator().set_params(integer=True)
    legend_outside(ax)
    return png_uri(fig)

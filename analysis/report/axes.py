"""Readable axes for every report figure: time units by magnitude, at most MAX_TICKS tick labels
on a numeric axis, thousands separators, and legends outside the data.

`tidy` runs on every axes when a figure is saved (figures.png_uri), so no figure can forget it;
categorical axes (run labels, collective names) keep their own ticks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import (
    Formatter,
    FuncFormatter,
    LogFormatter,
    LogLocator,
    MaxNLocator,
    ScalarFormatter,
)

__all__ = [
    "MAX_TICKS",
    "TIME_UNITS",
    "bytes_axis",
    "declutter",
    "legend_outside",
    "tidy",
    "time_unit",
]

MAX_TICKS = 8  # tick labels per numeric axis, at most
# (unit, microseconds per unit), largest first: a figure's times are shown in the largest unit
# its biggest value reaches 1 of (200,000 µs → 200 ms; 900 µs stays µs).
TIME_UNITS = (("s", 1e6), ("ms", 1e3), ("µs", 1.0))


def time_unit(max_us: float) -> tuple[str, float]:
    """(unit, µs per unit) for times up to `max_us` microseconds."""
    for unit, per in TIME_UNITS:
        if math.isfinite(max_us) and abs(max_us) >= per:
            return unit, per
    return TIME_UNITS[-1]


class Thousands(Formatter):
    """Tick labels with thousands separators and the fewest decimals that keep them exact
    (0, 2,500, 5,000; or 0.25, 0.50); a unicode minus for negatives."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return self.format_ticks([x])[0]

    def format_ticks(self, values: Sequence[float]) -> list[str]:
        values = list(values)
        digits = next(
            (
                d
                for d in range(7)
                if all(abs(v - round(v, d)) <= 1e-9 * max(1.0, abs(v)) for v in values)
            ),
            6,
        )
        return [f"{v:,.{digits}f}".replace("-", "\u2212") for v in values]


def _default_format(axis) -> bool:
    """True unless a figure set its own tick formatter (bytes_axis): that one is kept."""
    return isinstance(axis.get_major_formatter(), ScalarFormatter | LogFormatter)


def tidy(ax: plt.Axes) -> None:
    """At most MAX_TICKS ticks on each numeric axis of `ax`, with thousands separators on linear
    and base-2 log axes. Categorical axes (a FixedLocator: run labels, names) keep their ticks."""
    for axis in (ax.xaxis, ax.yaxis):
        locator = axis.get_major_locator()
        if axis.get_scale() == "log":
            base = axis.get_transform().base
            axis.set_major_locator(LogLocator(base=base, numticks=MAX_TICKS))
            if base == 2 and _default_format(axis):  # 1, 4, 16, ... ranks: plain integers
                axis.set_major_formatter(FuncFormatter(_power_of_two))
        elif isinstance(locator, MaxNLocator) and axis.get_scale() == "linear":
            integer = bool(locator._integer)  # keep "integer ticks" (world sizes); no getter
            axis.set_major_locator(
                MaxNLocator(nbins=MAX_TICKS - 1, steps=[1, 2, 2.5, 5, 10], integer=integer)
            )
            if _default_format(axis):
                axis.set_major_formatter(Thousands())


def labels_overlap(axis, renderer) -> bool:
    """True when two of the axis's drawn tick labels touch (with 2 px to spare)."""
    boxes = sorted(
        (t.get_window_extent(renderer) for t in axis.get_ticklabels() if t.get_text().strip()),
        key=lambda bb: (bb.x0, bb.y0),
    )
    return any(
        a.x0 < b.x1 + 2 and b.x0 < a.x1 + 2 and a.y0 < b.y1 and b.y0 < a.y1
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
    )


def declutter(fig: plt.Figure) -> None:
    """Fewer ticks on any numeric axis whose labels would touch (a narrow panel, wide labels):
    the figure is laid out, measured and thinned until no two labels of an axis meet."""
    for _ in range(MAX_TICKS):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        crowded = [
            axis
            for ax in fig.axes
            for axis in (ax.xaxis, ax.yaxis)
            if ax.get_visible() and labels_overlap(axis, renderer)
        ]
        thinned = [axis for axis in crowded if _thin(axis)]
        if not thinned:
            return


def _thin(axis) -> bool:
    """One tick fewer on a numeric axis; False when it cannot (categorical or already 2)."""
    loc = axis.get_major_locator()
    if isinstance(loc, MaxNLocator) and loc._nbins != "auto" and loc._nbins > 2:
        loc.set_params(nbins=loc._nbins - 1)
        return True
    if isinstance(loc, LogLocator) and loc.numticks > 2:
        loc.set_params(numticks=loc.numticks - 1)
        return True
    return False


def _power_of_two(value: float, _pos: int | None = None) -> str:
    """A base-2 log tick on its own (1, 16, 1,024; 0.5): never padded to its neighbours' digits."""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _bytes(value: float, _pos: int | None = None) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:,.4g} {unit}"
    return f"{value:,.4g} B"


def bytes_axis(axis) -> None:
    """Tick labels in B, KiB, MiB, GiB (a message-size axis)."""
    axis.set_major_formatter(FuncFormatter(_bytes))


def legend_outside(ax: plt.Axes, **kw) -> None:
    """The axes' legend to the right of its data, never over it."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), **kw)

"""Issue 27: figure axes. Time units by magnitude, at most 8 tick labels with thousands separators
on numeric axes, categorical axes left alone, and crowded labels thinned until none touch."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from analysis.report.axes import MAX_TICKS, Thousands, declutter, labels_overlap, tidy, time_unit  # noqa: E402


@pytest.mark.parametrize(
    ("max_us", "unit"),
    [(0.5, "µs"), (900.0, "µs"), (1_000.0, "ms"), (200_000.0, "ms"), (3e6, "s")],
)
def test_time_unit_by_magnitude(max_us, unit):
    assert time_unit(max_us)[0] == unit


def test_thousands_separators_and_fewest_exact_decimals():
    assert Thousands().format_ticks([0, 2500, 5000, 1_250_000]) == [
        "0",
        "2,500",
        "5,000",
        "1,250,000",
    ]
    assert Thousands().format_ticks([0.25, 0.5, 0.75]) == ["0.25", "0.50", "0.75"]
    assert Thousands().format_ticks([-1.0, 0.0]) == ["\u22121", "0"]


def _visible_labels(axis) -> list[str]:
    lo, hi = sorted(axis.get_view_interval())
    return [
        t.get_text()
        for t in axis.get_ticklabels()
        if lo <= t.get_position()[axis.axis_name == "y"] <= hi
    ]


def test_tidy_limits_numeric_ticks_and_keeps_categorical_ones():
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3))
    a1.plot([0, 1, 2], [0, 123_456, 234_567])
    a2.barh([f"run {i}" for i in range(12)], range(12))  # 12 categories: all stay
    for ax in (a1, a2):
        tidy(ax)
    fig.canvas.draw()
    ys = _visible_labels(a1.yaxis)
    assert 2 <= len(ys) <= MAX_TICKS and any("," in y for y in ys), ys
    assert len(a2.get_yticklabels()) == 12
    plt.close(fig)


def test_declutter_thins_crowded_labels():
    fig, ax = plt.subplots(figsize=(1.6, 1.5))
    ax.plot([0, 1], [0, 12_345_678])
    ax.set_xlim(0, 12_345_678)
    tidy(ax)
    fig.canvas.draw()
    assert labels_overlap(
        ax.xaxis, fig.canvas.get_renderer()
    )  # 8 labels of 10 characters on 1.6 in
    declutter(fig)
    assert not labels_overlap(ax.xaxis, fig.canvas.get_renderer())
    plt.close(fig)

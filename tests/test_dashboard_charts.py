"""The history charts (dashboards.charts) and the order of a workload page's lists (dashboards.workloads)."""

from __future__ import annotations

import datetime as dt
import itertools
import xml.etree.ElementTree as ET

from hypothesis import given, settings
from hypothesis import strategies as st

from dashboards.charts import (
    CHAR_EM,
    LABEL_FONT,
    TICK_FONT,
    Point,
    Series,
    StepMark,
    Suspect,
    history_chart,
    text_width,
    wrap,
)
from dashboards.workloads import mode_key
from matrix.regressions.observations import natural_key
from suites.options import MODE_NAMES

SVG = "{http://www.w3.org/2000/svg}"
LONG_NAME = "grace-cgct-pi-with-a-name-far-longer-than-any-panel-row-can-hold_" + "x" * 120


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # also proves the SVG is well-formed XML


def series(name: str, values: list[float], **kwargs: object) -> Series:
    points = tuple(Point(x, v, f"run {x}: {v} ms") for x, v in enumerate(values))
    return Series(name, points, **kwargs)  # type: ignore[arg-type]


def texts(root: ET.Element, cls: str) -> list[ET.Element]:
    return [t for t in root.iter(f"{SVG}text") if t.get("class") == cls]


def test_every_mode_name_is_written_in_full_inside_the_chart() -> None:
    names = [*MODE_NAMES, LONG_NAME]
    width = 640
    root = parse(history_chart([series(n, [1.0, 1.1, 1.05]) for n in names], width=width))
    legends = texts(root, "legend")
    assert ["".join(t.itertext()) for t in legends] == names  # one header per panel, nothing cut
    for legend in legends:
        lines = list(legend.iter(f"{SVG}tspan"))
        assert lines
        for line in lines:
            assert float(line.get("x", "0")) + text_width(line.text or "", LABEL_FONT) <= width
    assert len(list(legends[-1].iter(f"{SVG}tspan"))) > 1  # the long name wrapped, not clipped
    assert len(list(legends[MODE_NAMES.index("pt2cg-nopartition")].iter(f"{SVG}tspan"))) == 1


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=0, max_size=300), st.integers(min_value=1, max_value=700))
def test_wrapping_keeps_every_character_and_fits_the_room(text: str, room: int) -> None:
    lines = wrap(text, LABEL_FONT, room)
    assert "".join(lines) == text
    per_char = LABEL_FONT * CHAR_EM
    assert all(len(line) <= max(1, int(room // per_char)) for line in lines)


def test_a_long_history_has_several_evenly_spaced_dated_ticks() -> None:
    start = dt.date(2026, 9, 1)
    labels = {x: f"{start + dt.timedelta(days=x):%m-%d}" for x in range(90)}
    root = parse(history_chart([series("eager", [2.0 + 0.01 * (x % 3) for x in range(90)])], labels))
    ticks = [t.text for t in texts(root, "xtick")]
    assert len(ticks) > 2
    assert ticks[0] == labels[0] and ticks[-1] == labels[89]
    xs = [float(t.get("x", "0")) for t in texts(root, "xtick")]
    gaps = [b - a for a, b in itertools.pairwise(xs)]
    assert max(gaps) - min(gaps) < 0.1 * max(gaps)  # evenly spaced
    assert min(gaps) > max(text_width(t or "", TICK_FONT) for t in ticks)  # labels do not overlap


def test_two_runs_on_one_day_give_one_tick() -> None:
    root = parse(history_chart([series("eager", [1.0, 1.0, 1.1])], {0: "01-01", 1: "01-01", 2: "01-02"}))
    assert [t.text for t in texts(root, "xtick")] == ["01-01", "01-02"]


def test_the_y_axis_names_its_unit_in_every_panel() -> None:
    root = parse(history_chart([series("eager", [5.0, 5.1]), series("grace", [2.0, 2.1])]))
    assert [t.text for t in texts(root, "tick")].count("median ms") == 2
    assert len([g for g in root.iter(f"{SVG}g") if g.get("class") == "panel"]) == 2


def test_a_single_run_is_one_marked_point_per_mode_with_its_value_centred() -> None:
    width = 640
    chart = history_chart(
        [series(m, [v]) for m, v in (("eager", 5.5), ("pt2cg", 2.25))], {0: "12-01"}, width=width
    )
    root = parse(chart)
    assert "<polyline" not in chart
    circles = list(root.iter(f"{SVG}circle"))
    values = texts(root, "value")
    assert len(circles) == len(values) == 2
    for circle, value, expected in zip(circles, values, ("5.5 ms", "2.25 ms"), strict=True):
        cx = float(circle.get("cx", "0"))
        assert 0.4 * width < cx < 0.6 * width  # in the middle of the panel, not on the y axis
        assert value.get("text-anchor") == "middle" and float(value.get("x", "0")) == cx
        assert float(value.get("y", "0")) < float(circle.get("cy", "0"))  # above the point
        assert value.text == expected
    assert [t.text for t in texts(root, "xtick")] == ["12-01"]


def test_a_suspect_latest_point_gets_a_hollow_ring_with_its_reason() -> None:
    values = [2.0, 2.01, 1.99, 2.0, 2.4]
    plain = history_chart([series("pt2cg", values)])
    assert 'class="suspect"' not in plain
    root = parse(history_chart([series("pt2cg", values, suspect=Suspect(0.2))]))
    (ring,) = [c for c in root.iter(f"{SVG}circle") if c.get("class") == "suspect"]
    assert ring.get("fill") == "none" and ring.get("stroke") == "#d62728"
    assert ring.findtext(f"{SVG}title") == (
        "pt2cg: last run: +20.0% vs previous median, not yet confirmed as a step"
    )
    last = [c for c in root.iter(f"{SVG}circle") if c.get("class") is None][-1]
    assert (ring.get("cx"), ring.get("cy")) == (last.get("cx"), last.get("cy"))


def test_steps_are_drawn_in_their_own_panel() -> None:
    root = parse(
        history_chart(
            [
                series("eager", [1.0] * 8),
                series("grace", [1.0] * 4 + [1.2] * 4, steps=(StepMark(4, "grace: x1.2", True, "x1.20"),)),
            ]
        )
    )
    panels = [g for g in root.iter(f"{SVG}g") if g.get("class") == "panel"]
    dashed = [[line for line in g.iter(f"{SVG}line") if line.get("stroke-dasharray")] for g in panels]
    assert [len(d) for d in dashed] == [0, 1]
    assert dashed[1][0].findtext(f"{SVG}title") == "grace: x1.2"


def test_noise_is_drawn_at_its_true_size_with_a_minimum_span() -> None:
    root = parse(history_chart([series("eager", [2.0, 2.002, 1.998, 2.001])], min_span=0.2))
    ticks = [float(t.text or "0") for t in texts(root, "tick") if t.text != "median ms"]
    assert max(ticks) - min(ticks) >= 0.1  # a 0.1% wobble does not fill the panel


def test_every_text_from_the_store_is_escaped() -> None:
    hostile = "<script>alert(1)</script>"
    chart = history_chart(
        [
            Series(
                f"{hostile}-mode",
                (Point(0, 1.0, f"{hostile} tooltip"), Point(1, 2.0, "x")),
                (StepMark(1, f"{hostile} step", True, f"{hostile} tag"),),
                Suspect(1.0),
            )
        ],
        {0: f"{hostile} date", 1: "<d>"},
        title=f"{hostile} title",
        unit="<u>",
        axis_title="<a>",
        x_title=f"{hostile} axis",
    )
    assert "<script>" not in chart and "<d>" not in chart and "<u>" not in chart and "<a>" not in chart
    assert "&lt;script&gt;" in chart
    root = parse(chart)
    assert not [e for e in root.iter() if e.tag.split("}")[-1] in ("script", "foreignObject", "a")]
    empty = history_chart([], title="<x>")
    assert "no data" in empty and "<x>" not in empty
    assert history_chart([Series("eager", ())]).count("no data") == 1


def test_versions_and_modes_sort_as_a_person_reads_them() -> None:
    cells = ["torch-2.11@NVIDIA H200", "torch-2.9@NVIDIA H200", "torch-2.10@NVIDIA H200"]
    assert sorted(cells, key=natural_key) == [cells[1], cells[2], cells[0]]
    modes = ["grace-cgct-pi", "zeta", "pt2cg-nopartition", "eager", "grace", "alpha2", "alpha10"]
    assert sorted(modes, key=mode_key) == [
        "eager",
        "pt2cg-nopartition",
        "grace",
        "grace-cgct-pi",
        "alpha2",
        "alpha10",
        "zeta",
    ]

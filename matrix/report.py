"""Per cell, workload and mode: the correctness verdict and the performance figures, from the store.

Problem: a person (or the results document) needs one table that says, for every cell, workload and
mode, whether it was correct and how fast it was relative to the baselines, with the graph facts that
explain the speed. Several runs of one cell may each cover part of the workloads (a GPU lease is too
short for all of them), so the table must merge runs without mixing figures of different runs.

Design: ``build_report`` selects runs through the read model (``matrix.readmodel.select_runs``: every
run matching the uids, labels and cells) and picks, for every (cell, workload, tier), the most recent
selected run that has any result for it, and reads that run's correctness and performance rows.
Speedups compare medians of the same run only: ``speedup_vs_X = median(X) / median(mode)``; None when
either side is missing or not ``ok``. Where the run timed the ``raw-graph`` reference (the workload's
kernels replayed bare, suites.raw_graph), each mode also gets ``vs_raw`` (its median over the reference's),
``host_overhead_us`` (the difference, in microseconds: what the layers around the graph cost per call)
and, from the back-to-back timings, ``b2b_ms`` and ``b2b_vs_raw``; tables show those columns only where
a reference was timed. A row of a training workload (its stored tags, ``matrix.training``) says so and
carries the iteration's kernel facts per phase; ``matrix.training_report`` builds the training view from
those rows. ``render_text`` and ``render_markdown`` format a ``Report``; the CLI
commands print or write them.

Invariants: read-only; figures are never combined across runs; a missing mode yields None, not 0; a
row whose results hold a value that reads as unreadable (``matrix.unreadable``) has the status
``unreadable`` and a reason naming the value, and no median (so no speedup).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from matrix import readmodel
from matrix.readmodel import RunInfo
from matrix.statuses import ResultStatus, row_status
from matrix.store.models import CorrectnessResult, PerformanceResult, Workload, checked_values
from matrix.text import markdown_text, one_line
from matrix.training import PhaseFacts, is_training, phases_of
from matrix.unreadable import describe
from suites.options import MODE_NAMES

REPORT_FORMAT = 1
BASELINES = ("inductor", "pt2cg")
MODE_ORDER = MODE_NAMES  # the suites' modes, in their order
COLUMNS = (
    "status",
    "median_ms",
    "floor_ms",
    "speedup_vs_inductor",
    "speedup_vs_pt2cg",
    "kernels_in_graphs",
    "kernel_launches",
    "graph_launches",
    "copy_bytes_per_replay",
    "compile_s",
    "calls_peak_mem",
    "mem_vs_pt2cg",
    "calls_peak_reserved",
    "reserved_vs_pt2cg",
)
RATIO_COLUMNS = ("mem_vs_pt2cg", "reserved_vs_pt2cg", "vs_raw", "b2b_vs_raw")  # shown as 1.23x
REFERENCE = "raw-graph"  # the physical reference mode (suites.raw_graph)
REFERENCE_COLUMNS = ("b2b_ms", "vs_raw", "b2b_vs_raw", "host_overhead_us")
OK = "ok"


@dataclasses.dataclass(frozen=True)
class ReportRow:
    cell: str
    run_uid: str
    workload: str
    tier: str
    mode: str
    status: ResultStatus | None  # the correctness verdict; the performance status when there is none
    perf_status: ResultStatus | None
    reason: str | None
    median_ms: float | None
    floor_ms: float | None
    speedup_vs_inductor: float | None
    speedup_vs_pt2cg: float | None
    kernels_in_graphs: int | None
    kernel_launches: int | None
    graph_launches: int | None
    copy_bytes_per_replay: int | None
    compile_s: float | None
    calls_peak_mem: int | None  # bytes: the suites' calls_peak_mem_bytes (after the compiling call)
    mem_vs_pt2cg: float | None  # calls_peak_mem over pt2cg's in the same run
    b2b_ms: float | None = None  # median per call of the back-to-back samples
    vs_raw: float | None = None  # median_ms over the raw-graph reference's in the same run
    b2b_vs_raw: float | None = None  # b2b_ms over the reference's
    host_overhead_us: float | None = None  # (median_ms - the reference's) in microseconds
    calls_peak_reserved: int | None = None  # bytes: the suites' calls_peak_reserved_bytes (same calls)
    reserved_vs_pt2cg: float | None = None  # calls_peak_reserved over pt2cg's in the same run
    training: bool = False  # the workload's stored tags say one call is a training iteration
    phases: tuple[PhaseFacts, ...] = ()  # a training iteration's kernel facts per phase, where recorded

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Report:
    runs: tuple[RunInfo, ...]
    rows: tuple[ReportRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT,
            "columns": list(COLUMNS),
            "runs": [run_to_dict(r) for r in self.runs],
            "rows": [r.to_dict() for r in self.rows],
        }

    def cells(self) -> list[str]:
        return list(dict.fromkeys(row.cell for row in self.rows))


def run_to_dict(run: RunInfo) -> dict[str, Any]:
    """A run as the report's JSON names it (``REPORT_FORMAT`` 1)."""
    return {
        "uid": run.uid,
        "cell": run.cell_id,
        "started_at": run.started_at.isoformat(),
        "label": run.label,
        "torch": run.torch_version,
        "triton": run.triton_version,
        "cuda": run.cuda_runtime,
        "gpu": run.gpu_name,
    }


def speedup(baseline_ms: float | None, ms: float | None) -> float | None:
    """How many times faster than the baseline (>1 is faster); None without two positive medians."""
    if baseline_ms is None or ms is None or baseline_ms <= 0 or ms <= 0:
        return None
    return baseline_ms / ms


def _mode_key(mode: str) -> tuple[int, str]:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def build_report(
    session: Session,
    uids: Iterable[str] = (),
    labels: Iterable[str] = (),
    cells: Iterable[str] = (),
    workloads: Sequence[str] = (),
) -> Report:
    selection = readmodel.Selection(tuple(uids), tuple(labels), tuple(cells), pick=readmodel.Pick.EVERY)
    candidates = readmodel.select_runs(readmodel.load_runs(session), selection)
    by_pk = {run.pk: run for run in candidates}
    if not by_pk:
        return Report((), ())
    names = _literal_names(workloads)
    correctness = session.execute(
        select(CorrectnessResult, Workload)
        .join(Workload, CorrectnessResult.workload_pk == Workload.id)
        .where(CorrectnessResult.run_pk.in_(by_pk), *([Workload.name.in_(names)] if names else []))
        .order_by(CorrectnessResult.id)
    ).all()
    performance = session.execute(
        select(PerformanceResult, Workload)
        .join(Workload, PerformanceResult.workload_pk == Workload.id)
        .where(PerformanceResult.run_pk.in_(by_pk), *([Workload.name.in_(names)] if names else []))
        .order_by(PerformanceResult.id)
    ).all()
    # (run pk, workload, tier) -> mode -> results; later rows (by id) of one key overwrite earlier ones
    found: dict[tuple[int, str, str], dict[str, dict[str, Any]]] = {}
    training: set[tuple[int, str, str]] = set()
    pairs: tuple[tuple[str, Sequence[Any]], ...] = (
        ("correctness", correctness),
        ("performance", performance),
    )
    for kind, results in pairs:
        for result, wl in results:
            if not _matches(wl.name, workloads):
                continue
            found.setdefault((result.run_pk, wl.name, wl.tier), {}).setdefault(result.mode, {})[kind] = result
            if is_training(wl.tags):
                training.add((result.run_pk, wl.name, wl.tier))
    order = {pk: i for i, pk in enumerate(by_pk)}  # oldest first
    keys: dict[int, list[tuple[str, str, str]]] = defaultdict(list)
    for run_pk, name, tier in found:
        keys[run_pk].append((by_pk[run_pk].cell_id, name, tier))
    latest = readmodel.owners_of(list(by_pk), keys)  # per (cell, workload, tier): the latest run with it
    rows: list[ReportRow] = []
    for (cell_id, name, tier), run_pk in sorted(latest.items()):
        modes = found[(run_pk, name, tier)]
        medians = {mode: median for mode, r in modes.items() if (median := _ok_median(r)) is not None}
        peaks = {mode: _calls_peak(r) for mode, r in modes.items()}
        reserved = {mode: _calls_peak(r, "calls_peak_reserved_bytes") for mode, r in modes.items()}
        b2b = {mode: _details_float(r.get("performance"), "b2b_ms_median") for mode, r in modes.items()}
        for mode in sorted(modes, key=_mode_key):
            row = _row(cell_id, by_pk[run_pk].uid, name, tier, mode, modes[mode], medians, peaks, reserved)
            if (run_pk, name, tier) in training:
                perf = modes[mode].get("performance")
                phases = phases_of(perf.details if perf is not None else None)
                row = dataclasses.replace(row, training=True, phases=phases)
            rows.append(_against_reference(row, medians.get(REFERENCE), b2b.get(mode), b2b.get(REFERENCE)))
    used = sorted({pk for pk in latest.values()}, key=lambda pk: order[pk])
    return Report(tuple(by_pk[pk] for pk in used), tuple(rows))


def _literal_names(patterns: Sequence[str]) -> tuple[str, ...]:
    """``patterns`` when none is a glob (they can be matched in the query); () otherwise."""
    if not patterns or any(c in p for p in patterns for c in "*?["):
        return ()
    return tuple(patterns)


def _row(
    cell: str,
    uid: str,
    workload: str,
    tier: str,
    mode: str,
    results: dict[str, Any],
    medians: dict[str, float],
    peaks: dict[str, int | None],
    reserved: dict[str, int | None],
) -> ReportRow:
    corr: CorrectnessResult | None = results.get("correctness")
    perf: PerformanceResult | None = results.get("performance")
    corr_status = row_status(corr.status, *checked_values(corr).values()) if corr is not None else None
    perf_status = row_status(perf.status, *checked_values(perf).values()) if perf is not None else None
    median = _ok_median(results)
    status = corr_status if corr is not None else perf_status
    reason = corr.reason if corr is not None and corr.status != "pass" else (perf.reason if perf else None)
    unreadable = [describe(checked_values(r)) for r in (corr, perf) if r is not None]
    if any(unreadable):
        status, reason = ResultStatus.UNREADABLE, "; ".join(text for text in unreadable if text)
    return ReportRow(
        cell=cell,
        run_uid=uid,
        workload=workload,
        tier=tier,
        mode=mode,
        status=status,
        perf_status=perf_status,
        reason=reason,
        median_ms=median,
        floor_ms=_number(perf.floor_ms) if perf is not None else None,
        speedup_vs_inductor=speedup(medians.get("inductor"), median),
        speedup_vs_pt2cg=speedup(medians.get("pt2cg"), median),
        kernels_in_graphs=perf.kernels_in_graphs if perf is not None else None,
        kernel_launches=perf.kernel_launches if perf is not None else None,
        graph_launches=perf.graph_launches if perf is not None else None,
        copy_bytes_per_replay=perf.copy_bytes_per_replay if perf is not None else None,
        compile_s=_number(perf.compile_s)
        if perf is not None and perf.compile_s is not None
        else _details_float(corr, "compile_s"),
        calls_peak_mem=peaks.get(mode),
        mem_vs_pt2cg=_ratio(peaks.get(mode), peaks.get("pt2cg")),
        calls_peak_reserved=reserved.get(mode),
        reserved_vs_pt2cg=_ratio(reserved.get(mode), reserved.get("pt2cg")),
    )


def _against_reference(
    row: ReportRow, raw_ms: float | None, b2b_ms: float | None, raw_b2b_ms: float | None
) -> ReportRow:
    """The row with its figures against the raw-graph reference of the same run (None without one)."""
    if row.median_ms is None:
        b2b_ms = None  # a mode that was not timed ok has no back-to-back figure either
    overhead = (row.median_ms - raw_ms) * 1e3 if row.median_ms is not None and raw_ms else None
    return dataclasses.replace(
        row,
        b2b_ms=b2b_ms,
        vs_raw=_ratio(row.median_ms, raw_ms),
        b2b_vs_raw=_ratio(b2b_ms, raw_b2b_ms),
        host_overhead_us=overhead,
    )


def _ok_median(results: dict[str, Any]) -> float | None:
    """The median of a mode's performance row when it is ``ok`` and every value of it is readable."""
    perf: PerformanceResult | None = results.get("performance")
    if perf is None or row_status(perf.status, *checked_values(perf).values()) != OK:
        return None
    return _number(perf.median_ms)


def _number(value: object) -> float | None:
    """A stored number as the report shows it (an unreadable one is no figure: its row says why)."""
    return value if isinstance(value, float) else None


def _details_float(result: CorrectnessResult | PerformanceResult | None, key: str) -> float | None:
    if result is None or not isinstance(result.details, dict):
        return None
    value = result.details.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _calls_peak(results: dict[str, Any], key: str = "calls_peak_mem_bytes") -> int | None:
    """The mode's peak memory after its compiling call (recorded by suites since it was measured):
    allocated, or with ``key`` ``calls_peak_reserved_bytes`` reserved by the caching allocator."""
    for kind in ("performance", "correctness"):
        value = _details_float(results.get(kind), key)
        if value is not None:
            return int(value)
    return None


def _ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``; None without both, or with a baseline of 0 (bytes or ms)."""
    if value is None or not baseline:
        return None
    return value / baseline


# -- formatting -----------------------------------------------------------------------------------------


def fmt(column: str, value: Any) -> str:
    """One cell of a table, for people: '-' for missing, ms with 3 decimals, speedups as 1.23x."""
    if value is None:
        return "-"
    if column.startswith("speedup") or column in (
        "mem_vs_pt2cg",
        "reserved_vs_pt2cg",
        "vs_raw",
        "b2b_vs_raw",
    ):
        return f"{value:.2f}x"
    if column in ("median_ms", "floor_ms", "b2b_ms"):
        return f"{value:.3f}"
    if column == "host_overhead_us":
        return f"{value:.1f}"
    if column == "compile_s":
        return f"{value:.1f}"
    if column in ("copy_bytes_per_replay", "calls_peak_mem", "calls_peak_reserved"):
        return _bytes(int(value))
    return str(value)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _environment(run: RunInfo) -> str:
    parts = [
        f"torch {run.torch_version or '-'}",
        f"triton {run.triton_version or '-'}",
        f"CUDA {run.cuda_runtime or '-'}",
        run.gpu_name or "no GPU",
    ]
    return ", ".join(parts)


def columns_of(rows: Sequence[ReportRow]) -> tuple[str, ...]:
    """The columns a table of ``rows`` shows: the reference's only where a reference was timed."""
    if any(row.mode == REFERENCE and row.median_ms is not None for row in rows):
        return (*COLUMNS, *REFERENCE_COLUMNS)
    return COLUMNS


def render_text(report: Report) -> str:
    """Aligned text tables, one per cell."""
    if not report.rows:
        return "no results match (run the suites with the recorder first)\n"
    out: list[str] = []
    for cell in report.cells():
        columns = columns_of([row for row in report.rows if row.cell == cell])
        header = ["workload", "tier", "mode", *columns]
        runs = [r for r in report.runs if r.cell_id == cell]
        out.append(f"cell {cell}: {_environment(runs[-1])}; runs {', '.join(r.uid[:8] for r in runs)}")
        table = [
            [row.workload, row.tier, row.mode, *(fmt(c, getattr(row, c)) for c in columns)]
            for row in report.rows
            if row.cell == cell
        ]
        widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
        out.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
        out.extend("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in table)
        notes = [row for row in report.rows if row.cell == cell and row.status not in ("pass", OK)]
        if notes:
            out.append("not passing:")
            out.extend(
                f"  {row.workload} / {row.mode}: {row.status}: {one_line(row.reason, 240)}" for row in notes
            )
        out.append("")
    return "\n".join(out)


_md = markdown_text  # every stored string in docs/RESULTS.md, as docs/COMPATIBILITY.md escapes it


def render_markdown(report: Report, title: str = "Results", command: str = "grace-matrix results-doc") -> str:
    """docs/RESULTS.md: per cell its environment, the table, then every non-passing verdict's reason."""
    lines = [
        f"# {title}",
        "",
        f"<!-- Generated by `{command}` from the results store. Do not edit by hand. -->",
        "",
        "Speedups compare medians of the same run (`speedup_vs_X = median(X) / median(mode)`, above 1 is "
        "faster); the floor is the GPU-busy time of one call; `calls_peak_mem` is the peak memory allocated "
        "in the calls after the compiling one (recording or deciding, first replays), `mem_vs_pt2cg` its "
        "ratio to pt2cg's in the same run, `calls_peak_reserved` and `reserved_vs_pt2cg` the same for the "
        "memory the caching allocator reserved (graph pools whole: cudagraph trees' replays hand out "
        "tensors that `memory_allocated` does not count); where the run timed the `raw-graph` reference "
        "(the kernels replayed bare), `vs_raw` and `host_overhead_us` compare each mode's median with it, "
        "and `b2b_ms`, `b2b_vs_raw` do so for calls launched back to back; `-` means not measured.",
        "",
    ]
    if not report.rows:
        return "\n".join([*lines, "No results in the store.", ""])
    for cell in report.cells():
        rows = [row for row in report.rows if row.cell == cell]
        columns = columns_of(rows)
        header = ["workload", "tier", "mode", *columns]
        runs = [r for r in report.runs if r.cell_id == cell]
        lines += [f"## Cell `{_md(cell)}`", "", f"{_md(_environment(runs[-1]))}.", ""]
        lines += [
            f"Runs: {', '.join(f'`{_md(r.uid)}` ({r.started_at:%Y-%m-%d %H:%M} UTC)' for r in runs)}.",
            "",
        ]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            values = [row.workload, row.tier, row.mode, *(fmt(c, getattr(row, c)) for c in columns)]
            lines.append("| " + " | ".join(_md(v) for v in values) + " |")
        notes = [row for row in rows if row.status not in ("pass", OK)]
        if notes:
            lines += ["", "Not passing:", ""]
            lines += [
                f"- {_md(row.workload)} / {_md(row.mode)}: `{_md(row.status)}`: {_md(row.reason)}"
                for row in notes
            ]
        lines.append("")
    return "\n".join(lines)

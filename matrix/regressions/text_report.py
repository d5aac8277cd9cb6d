"""The regressions report as the lines a person reads: per judged cell its run, baseline and verdict
counts, then each regression (NEW when the baseline did not have it) with its message and the command
that reproduces it, then improvements; last, the count of new regressions. ``grace-matrix regressions``
prints it and ``grace-matrix nightly`` writes it beside the night's logs."""

from __future__ import annotations

from matrix.regressions.report import RegressionReport


def report_text(report: RegressionReport) -> str:
    lines: list[str] = []
    if not report.cells:
        return "no finished runs in the store: nothing to judge"
    for cell in report.cells:
        run, base = cell.run, cell.baseline
        verdicts: dict[str, int] = {}
        for f in cell.findings:
            verdicts[f.verdict.value] = verdicts.get(f.verdict.value, 0) + 1
        counts = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) or "no results"
        against = f"vs {base.started_at:%Y-%m-%d} {base.short_uid}" if base else "no baseline"
        parts = f" (+{len(run.uids) - 1} runs of label {run.label})" if len(run.uids) > 1 else ""
        lines.append(
            f"{run.cell_id} ({run.gpu_name or 'no GPU'}) run {run.short_uid}{parts} "
            f"{run.started_at:%Y-%m-%d} {against}: {counts}"
        )
        for r in cell.regressions:
            tag = "NEW " if r.new else "    "
            lines.append(f"  {tag} {r.kind.value:<11} {r.key.label()}  {r.summary}")
            if r.message:
                first = r.message.strip().splitlines()[0] if r.message.strip() else ""
                lines.append(f"       message: {first[:200]}")
            lines.append(f"       reproduce: {r.repro}")
        for label in cell.improvements:
            lines.append(f"  IMPROVED    {label}  (update expected.toml)")
    new, total = len(report.new_regressions), len(report.regressions)
    lines.append(
        f"{new} new regression{'s' if new != 1 else ''} ({total} total) in {len(report.cells)} cells"
    )
    return "\n".join(lines)

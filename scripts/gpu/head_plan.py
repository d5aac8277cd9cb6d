"""Plan the next GPU call of a head run: one logical run, at one commit, of every workload in every mode.

A head run does not fit one lease call, and the device's store does not outlive the machine, so the
parts come back as exports (``suites-export.jsonl``, committed under ``results/``). This reads those
exports, keeps the runs labelled ``--label`` (default ``head-<sha[:12]>``), checks that every one of
them was made at ``--sha`` (a label that mixes commits is refused: it would be a stitched run), and
prints what the next call must run: the workloads, in run order, that still lack a correctness or a
performance record in some mode, as the ``--workloads`` list of ``scripts/gpu/session.sh suites``.

usage: python scripts/gpu/head_plan.py --sha SHA [--label L] [--tier standard] [--modes M,...]
                                       [--json | --next-args] EXPORT...

A (workload, mode) is done when the label's runs hold both of its records, whatever their status: a
failure is a result, not a gap (rerunning it at the same commit would only hide it). Exit status: 0 when
something is left to run, 3 when the head run is complete, 2 for bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from matrix.errors import ConfigError
from matrix.store.models import CorrectnessResult, PerformanceResult, Run, Workload
from matrix.transfer import store_of_exports
from suites.modes import SPECS, Mode

COMPLETE = 3
# Every mode a GPU runs: the CPU-only mode checks a path no GPU run takes.
GPU_MODES = tuple(mode.value for mode in Mode if not SPECS[mode].cpu_only)


@dataclass(frozen=True)
class Plan:
    label: str
    sha: str
    runs: int
    done: int
    wanted: int
    next_workloads: tuple[str, ...]
    missing: dict[str, list[str]]  # workload -> modes without both records
    next_modes: tuple[str, ...] = ()  # every mode some workload of the next call lacks, as asked for

    def suites_arguments(self) -> list[str]:
        """The next call's arguments for scripts/gpu/run_suites.sh."""
        workloads, modes = ",".join(self.next_workloads), ",".join(self.next_modes)
        return ["--workloads", workloads, "--modes", modes, "--label", self.label]

    def as_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "sha": self.sha,
            "runs": self.runs,
            "done": self.done,
            "wanted": self.wanted,
            "next_workloads": list(self.next_workloads),
            "next_modes": list(self.next_modes),
            "missing": self.missing,
        }


def recorded(session: Session, label: str, sha: str, tier: str) -> tuple[int, set[tuple[str, str, str]]]:
    """The label's runs (all at ``sha``, else ConfigError) and their (kind, workload, mode) records at
    ``tier``."""
    runs = session.scalars(select(Run).where(Run.label == label)).all()
    others = sorted({run.git_sha or "unknown" for run in runs if run.git_sha != sha})
    if others:
        raise ConfigError(f"label {label} has runs at other commits than {sha}: {', '.join(others)}")
    pks = [run.id for run in runs]
    found: set[tuple[str, str, str]] = set()
    for kind, table in (("correctness", CorrectnessResult), ("performance", PerformanceResult)):
        query = (
            select(Workload.name, table.mode)
            .join(table.workload)
            .where(table.run_pk.in_(pks), Workload.tier == tier)
        )
        found.update((kind, name, mode) for name, mode in session.execute(query))
    return len(runs), found


def plan(session: Session, label: str, sha: str, tier: str, modes: Sequence[str]) -> Plan:
    from suites.workloads import select as select_workloads  # imports torch: only once the input is good

    runs, found = recorded(session, label, sha, tier)
    missing: dict[str, list[str]] = {}
    done = 0
    names = [wl.name for wl in select_workloads("*")]  # every workload has a size for every tier
    for name in names:
        for mode in modes:
            if ("correctness", name, mode) in found and ("performance", name, mode) in found:
                done += 1
            else:
                missing.setdefault(name, []).append(mode)
    lacking = {mode for left in missing.values() for mode in left}
    next_modes = tuple(mode for mode in modes if mode in lacking)
    return Plan(label, sha, runs, done, len(names) * len(modes), tuple(missing), missing, next_modes)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sha", required=True, help="the head run's commit (its full id)")
    parser.add_argument("--label", default=None, help="the runs' label (default head-<sha[:12]>)")
    parser.add_argument("--tier", default="standard", choices=("smoke", "standard", "full"))
    parser.add_argument("--modes", default=",".join(GPU_MODES), help="default: every mode a GPU runs")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--next-args", action="store_true", help="print only run_suites.sh's arguments, one per line"
    )
    parser.add_argument("exports", nargs="*", help="export files (grace-matrix export) holding its parts")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if len(args.sha) != 40 or any(c not in "0123456789abcdef" for c in args.sha):
            raise ConfigError(f"--sha {args.sha!r} is not a full commit id (40 hex digits)")
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in GPU_MODES]
        if unknown or not modes:
            raise ConfigError(f"--modes: {', '.join(unknown) or 'none'}; choose from {', '.join(GPU_MODES)}")
        label = args.label or f"head-{args.sha[:12]}"
        with store_of_exports(args.exports)() as session:
            result = plan(session, label, args.sha, args.tier, modes)
    except ConfigError as exc:
        print(f"head_plan: error: {exc}", file=sys.stderr)
        return 2
    if args.next_args:
        print("\n".join(result.suites_arguments()) if result.next_workloads else "", end="")
    elif args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        pairs = f"{result.done} of {result.wanted} (workload, mode) pairs"
        print(f"{label} at {args.sha}: {pairs} recorded in {result.runs} run(s)")
        for name, left in result.missing.items():
            print(f"  {name}: {', '.join(left)}")
        if result.next_workloads:
            print(f"next: {' '.join(result.suites_arguments())}")
    return 0 if result.next_workloads else COMPLETE


if __name__ == "__main__":
    sys.exit(main())

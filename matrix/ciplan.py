"""The nightly CI plan: .github/workflows/nightly.yml rendered from matrix.toml and runners.toml.

Problem: the nightly run fans every cell of the matrix out to a runner that can run it (a GPU of the
right model and a driver for the cell's CUDA variant), collects each cell's results, merges them with
the previous nightly's, judges regressions and publishes the dashboard. Written by hand, the workflow
would drift from matrix.toml the first time a cell is added, and a cell silently missing from the
nightly is a regression nobody sees.

Design: ``build_workflow`` turns a ``Matrix`` and a ``RunnerConfig`` into the workflow as plain data;
``render`` writes it with the deterministic writer of matrix.ciyaml; ``check`` compares it with the
committed file. The workflow has four kinds of jobs:

- ``plan``: checks that the committed workflow still matches matrix.toml (``ci-plan --check``), and
  names the nightly (``nightly-<date>-<run number>``: the label of every run it records).
- one job per cell that can run on its runner: checks out, runs ``nox -s "cell(<id>)"`` into a store in
  the job's temporary directory, exports the store (``grace-matrix export``) and uploads the export as
  the artifact ``store-<id>``, even when the cell failed (a failed cell is a result too).
- ``report``: downloads every cell's export, ingests them with the committed results (``results/``) and
  the previous nightly's merged store (``.ci/nightly-previous.sh``) into one store in one transaction,
  runs ``grace-matrix regressions`` on tonight's label (baseline: each cell's previous complete run),
  renders the dashboard, uploads the merged store as ``nightly-store`` (the next nightly's baseline),
  and fails when a new regression appears, after everything above has been saved.
- ``pages`` (when enabled): deploys the rendered site from the default branch.

Invariants:
- Every cell of matrix.toml has a job, unless an exclusion rules it out for its runner's Python and
  platform; those are named, with the reason, in the workflow's header comment.
- Job ids are derived from cell ids and unique; artifact names are ``store-<cell id>``.
- Rendering is a pure function of (matrix, runners): same inputs, same bytes.
"""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matrix import ciyaml
from matrix.cells import CellSpec, Matrix
from matrix.errors import ConfigError
from matrix.infiles import read_text
from matrix.runners import RunnerConfig, RunnerProfile

logger = logging.getLogger(__name__)

WORKFLOW_PATH = Path(".github/workflows/nightly.yml")
ARTIFACT_PREFIX = "store-"
HISTORY_ARTIFACT = "nightly-store"
REPORT_ARTIFACT = "nightly-report"
CHECKOUT = "actions/checkout@v4"
SETUP_PYTHON = "actions/setup-python@v5"
UPLOAD = "actions/upload-artifact@v4"
DOWNLOAD = "actions/download-artifact@v4"
UPLOAD_PAGES = "actions/upload-pages-artifact@v3"
DEPLOY_PAGES = "actions/deploy-pages@v4"
NOT_CANCELLED = "${{ !cancelled() }}"
LABEL = "${{ needs.plan.outputs.label }}"


@dataclass(frozen=True)
class CellJob:
    job_id: str
    cell: CellSpec
    profile: RunnerProfile


@dataclass(frozen=True)
class SkippedCell:
    cell_id: str
    reason: str


@dataclass(frozen=True)
class Plan:
    jobs: tuple[CellJob, ...]
    skipped: tuple[SkippedCell, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "jobs": [
                {
                    "job": j.job_id,
                    "cell": j.cell.id,
                    "runs_on": list(j.profile.runs_on),
                    "timeout_minutes": j.profile.timeout_minutes,
                    "python": j.profile.python,
                    "artifact": ARTIFACT_PREFIX + j.cell.id,
                }
                for j in self.jobs
            ],
            "skipped": [{"cell": s.cell_id, "reason": s.reason} for s in self.skipped],
        }


def job_id(cell_id: str) -> str:
    """``torch-2.4`` -> ``cell_torch-2_4`` (job ids allow letters, digits, '_' and '-')."""
    return "cell_" + re.sub(r"[^A-Za-z0-9_-]", "_", cell_id)


def plan_cells(matrix: Matrix, runners: RunnerConfig) -> Plan:
    """Which cells get a job, on which runner, and which cannot run there (with the reason)."""
    runners.check_against(matrix)
    jobs: list[CellJob] = []
    skipped: list[SkippedCell] = []
    seen: dict[str, str] = {}
    for cell in matrix.cells:
        profile = runners.profile_for(cell)
        # A runner's own interpreter (profile.python None) is unknown here: only platform rules apply.
        python = profile.python or "3"
        exclusion = matrix.exclusion_for(cell, python_version=python, platform_name=profile.platform)
        if exclusion is not None:
            skipped.append(SkippedCell(cell.id, exclusion.reason))
            continue
        jid = job_id(cell.id)
        if jid in seen:
            raise ConfigError(
                f"{matrix.source}: cells {seen[jid]!r} and {cell.id!r} map to the same CI job id {jid!r}; "
                "rename one of them"
            )
        seen[jid] = cell.id
        jobs.append(CellJob(jid, cell, profile))
    if not jobs:
        raise ConfigError(f"{matrix.source}: no cell can run on the configured runners; nothing to plan")
    return Plan(tuple(jobs), tuple(skipped))


def _runs_on(labels: tuple[str, ...]) -> str | list[str]:
    return labels[0] if len(labels) == 1 else list(labels)


def _setup_steps(python: str | None, install: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"name": "Check out", "uses": CHECKOUT}]
    if python is not None:
        steps.append({"name": "Set up Python", "uses": SETUP_PYTHON, "with": {"python-version": python}})
    steps.append({"name": "Install grace-matrix", "run": f"python -m pip install {install}\n"})
    return steps


def _plan_job(runners: RunnerConfig) -> dict[str, Any]:
    return {
        "name": "plan",
        "runs-on": _runs_on(runners.report.runs_on),
        "timeout-minutes": 10,
        "outputs": {"label": "${{ steps.label.outputs.label }}"},
        "steps": [
            *_setup_steps(runners.workflow.python, "."),
            {
                "name": "Check that this workflow matches matrix.toml",
                "run": "grace-matrix ci-plan --check\n",
            },
            {
                "name": "Name tonight's runs",
                "id": "label",
                "run": 'echo "label=nightly-$(date -u +%Y-%m-%d)-${GITHUB_RUN_NUMBER}" >> "$GITHUB_OUTPUT"\n',
            },
        ],
    }


def _cell_job(job: CellJob, runners: RunnerConfig) -> dict[str, Any]:
    cell, profile = job.cell, job.profile
    export = f"exports/{cell.id}.jsonl"
    what = ", ".join(profile.runs_on)
    return {
        "name": f"cell {cell.id} ({what})",
        "needs": "plan",
        "runs-on": _runs_on(profile.runs_on),
        "timeout-minutes": profile.timeout_minutes,
        "env": {"GRACE_MATRIX_LABEL": LABEL, "GRACE_MATRIX_CELL": cell.id},
        "steps": [
            *_setup_steps(profile.python, "nox ."),
            {
                # Each job's store lives in the runner's temporary directory, emptied between jobs.
                "name": "Use a fresh store",
                "run": 'echo "GRACE_MATRIX_HOME=$RUNNER_TEMP/grace-matrix" >> "$GITHUB_ENV"\n',
            },
            {"name": f"Run cell {cell.id}", "run": f'python -m nox -s "cell({cell.id})"\n'},
            {
                "name": "Export the cell's store",
                "if": NOT_CANCELLED,
                "run": f'mkdir -p exports\ngrace-matrix export --label "$GRACE_MATRIX_LABEL" -o {export}\n',
            },
            {
                "name": "Upload the export",
                "if": NOT_CANCELLED,
                "uses": UPLOAD,
                "with": {
                    "name": ARTIFACT_PREFIX + cell.id,
                    "path": export,
                    "if-no-files-found": "error",
                    "retention-days": runners.workflow.export_retention_days,
                    "overwrite": True,
                },
            },
        ],
    }


_MERGE = """\
mkdir -p nightly
files=$( (find results nightly/previous nightly/exports -name '*.jsonl' 2>/dev/null || true) | sort)
if [ -z "$files" ]; then
  echo "::error::no cell export arrived; every cell job failed before uploading"
  exit 1
fi
# shellcheck disable=SC2086  # one argument per file; paths have no spaces
grace-matrix ingest $files
grace-matrix summary --label "$GRACE_MATRIX_LABEL" --all
"""

_REGRESSIONS = """\
set +e
grace-matrix regressions --run "$GRACE_MATRIX_LABEL" | tee nightly/regressions.txt
status=${PIPESTATUS[0]}
grace-matrix regressions --run "$GRACE_MATRIX_LABEL" --json > nightly/regressions.json
echo "status=$status" >> "$GITHUB_OUTPUT"
# 0: none, 1: new regressions (judged in the last step, after the site is saved), else: an error
[ "$status" -le 1 ]
"""


def _report_job(plan: Plan, runners: RunnerConfig) -> dict[str, Any]:
    extras = ",".join(runners.report.extras)
    install = f'".[{extras}]"' if extras else "."
    steps: list[dict[str, Any]] = [
        *_setup_steps(runners.workflow.python, install),
        {
            "name": "Download tonight's cell exports",
            "uses": DOWNLOAD,
            "with": {"pattern": ARTIFACT_PREFIX + "*", "path": "nightly/exports", "merge-multiple": True},
        },
        {
            "name": "Download the previous nightly's store",
            "env": {"GH_TOKEN": "${{ github.token }}"},
            "run": "bash .ci/nightly-previous.sh nightly/previous\n",
        },
        {"name": "Merge into one store", "run": _MERGE},
        {"name": "Detect regressions against the previous nightly", "id": "regressions", "run": _REGRESSIONS},
        {
            "name": "Render the dashboard",
            "id": "dashboard",
            "if": NOT_CANCELLED,
            "run": "grace-matrix dashboard --out nightly/site\n",
        },
        {
            "name": "Export the merged store",
            "if": NOT_CANCELLED,
            "run": "mkdir -p nightly/history\ngrace-matrix export -o nightly/history/store.jsonl\n",
        },
        {
            "name": "Upload the merged store (the next nightly's baseline)",
            "if": NOT_CANCELLED,
            "uses": UPLOAD,
            "with": {
                "name": HISTORY_ARTIFACT,
                "path": "nightly/history/store.jsonl",
                "if-no-files-found": "error",
                "retention-days": runners.workflow.history_retention_days,
                "overwrite": True,
            },
        },
        {
            "name": "Upload the regression report",
            "if": NOT_CANCELLED,
            "uses": UPLOAD,
            "with": {
                "name": REPORT_ARTIFACT,
                "path": "nightly/regressions.txt\nnightly/regressions.json\n",
                "if-no-files-found": "ignore",
                "overwrite": True,
            },
        },
    ]
    if runners.workflow.pages:
        steps.append(
            {
                "name": "Upload the site for GitHub Pages",
                "id": "site",
                "if": "${{ !cancelled() && steps.dashboard.outcome == 'success' }}",
                "uses": UPLOAD_PAGES,
                "with": {"path": "nightly/site"},
            }
        )
    steps.append(
        {
            "name": "Fail on new regressions",
            "if": "${{ steps.regressions.outputs.status == '1' }}",
            "run": 'echo "::error::new regressions in $GRACE_MATRIX_LABEL; see nightly/regressions.txt"\n'
            "exit 1\n",
        }
    )
    job: dict[str, Any] = {
        "name": "merge, regressions, dashboard",
        "needs": ["plan", *(j.job_id for j in plan.jobs)],
        "if": "${{ !cancelled() && needs.plan.result == 'success' }}",
        "runs-on": _runs_on(runners.report.runs_on),
        "timeout-minutes": runners.report.timeout_minutes,
        "permissions": {"contents": "read", "actions": "read"},
        "env": {
            "GRACE_MATRIX_LABEL": LABEL,
            "GRACE_MATRIX_DB": "sqlite:///${{ github.workspace }}/nightly/store.sqlite",
        },
    }
    if runners.workflow.pages:
        job["outputs"] = {"site": "${{ steps.site.outcome == 'success' }}"}
    job["steps"] = steps
    return job


def _pages_job() -> dict[str, Any]:
    return {
        "name": "publish the dashboard",
        "needs": "report",
        # Scheduled runs are on the default branch (and their event carries no repository).
        "if": "${{ !cancelled() && needs.report.outputs.site == 'true' && (github.event_name == 'schedule' "
        "|| github.ref_name == github.event.repository.default_branch) }}",
        "runs-on": "ubuntu-latest",
        "timeout-minutes": 10,
        "permissions": {"pages": "write", "id-token": "write"},
        "environment": {"name": "github-pages", "url": "${{ steps.deploy.outputs.page_url }}"},
        "steps": [{"name": "Deploy to GitHub Pages", "id": "deploy", "uses": DEPLOY_PAGES}],
    }


def build_workflow(matrix: Matrix, runners: RunnerConfig) -> tuple[dict[str, Any], Plan]:
    plan = plan_cells(matrix, runners)
    jobs: dict[str, Any] = {"plan": _plan_job(runners)}
    for job in plan.jobs:
        jobs[job.job_id] = _cell_job(job, runners)
    jobs["report"] = _report_job(plan, runners)
    if runners.workflow.pages:
        jobs["pages"] = _pages_job()
    workflow = {
        "name": runners.workflow.name,
        "on": {"schedule": [{"cron": runners.workflow.cron}], "workflow_dispatch": {}},
        "permissions": {"contents": "read"},
        "concurrency": {"group": "nightly-${{ github.ref }}", "cancel-in-progress": False},
        "jobs": jobs,
    }
    return workflow, plan


def _header(plan: Plan) -> str:
    lines = [
        "Generated by `grace-matrix ci-plan --write` from matrix.toml and matrix/runners.toml.",
        "Do not edit: change those files and run the command again (the tests fail when this file drifts).",
        f"{len(plan.jobs)} cells, one job each.",
    ]
    if plan.skipped:
        lines.append("Cells without a job (an exclusion of matrix.toml rules them out on their runner):")
        lines += [f"  {s.cell_id}: {s.reason}" for s in plan.skipped]
    return "\n".join(lines)


def render(matrix: Matrix, runners: RunnerConfig) -> str:
    workflow, plan = build_workflow(matrix, runners)
    return ciyaml.dump(workflow, _header(plan))


def drift(expected: str, path: Path) -> list[str]:
    """The unified diff from the file at ``path`` to ``expected``; empty when they agree."""
    try:
        current = read_text(path)
    except FileNotFoundError:
        current = ""
    if current == expected:
        return []
    return list(
        difflib.unified_diff(
            current.splitlines(),
            expected.splitlines(),
            f"{path} (committed)",
            f"{path} (from matrix.toml)",
            lineterm="",
        )
    )

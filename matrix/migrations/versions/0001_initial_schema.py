"""Initial schema: cells, runs, workloads, the result tables and expected statuses.

Revision ID: 0001
Revises:
Created: 2026-11-29 10:07:34.076762
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "cells",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("cell_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("torch_version", sa.String(length=64), nullable=True),
        sa.Column("triton_version", sa.String(length=64), nullable=True),
        sa.Column("cuda_runtime", sa.String(length=32), nullable=True),
        sa.Column("driver_version", sa.String(length=64), nullable=True),
        sa.Column("gpu_name", sa.String(length=128), nullable=True),
        sa.Column("gpu_capability", sa.String(length=16), nullable=True),
        sa.Column("python_version", sa.String(length=32), nullable=False),
        sa.Column("platform", sa.String(length=128), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("fingerprint"),
    )
    with op.batch_alter_table("cells", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_cells_cell_id"), ["cell_id"], unique=False)

    op.create_table(
        "expected_statuses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cell_pattern", sa.String(length=128), nullable=False),
        sa.Column("suite", sa.String(length=32), nullable=False),
        sa.Column("workload", sa.String(length=128), nullable=False),
        sa.Column("mode", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("flaky", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cell_pattern", "suite", "workload", "mode"),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("code_hash", sa.String(length=64), nullable=False),
        sa.Column("tier", sa.String(length=16), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", "code_hash"),
    )
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workloads_name"), ["name"], unique=False)

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uid", sa.String(length=36), nullable=False),
        sa.Column("cell_pk", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("label", sa.String(length=128), nullable=True),
        sa.Column("git_sha", sa.String(length=64), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["cell_pk"],
            ["cells.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("uid"),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runs_cell_pk"), ["cell_pk"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_label"), ["label"], unique=False)

    op.create_table(
        "correctness_results",
        sa.Column("workload_pk", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.Column("tolerance", sa.JSON(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("record_key", sa.String(length=512), nullable=False),
        sa.Column("nodeid", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["workload_pk"],
            ["workloads.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_pk", "record_key"),
    )
    with op.batch_alter_table("correctness_results", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_correctness_results_run_pk"), ["run_pk"], unique=False)
        batch_op.create_index(batch_op.f("ix_correctness_results_workload_pk"), ["workload_pk"], unique=False)

    op.create_table(
        "diagnostics",
        sa.Column("workload_pk", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=32), nullable=False),
        sa.Column("code", sa.String(length=64), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("transformed", sa.Boolean(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("record_key", sa.String(length=512), nullable=False),
        sa.Column("nodeid", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["workload_pk"],
            ["workloads.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_pk", "record_key"),
    )
    with op.batch_alter_table("diagnostics", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_diagnostics_run_pk"), ["run_pk"], unique=False)
        batch_op.create_index(batch_op.f("ix_diagnostics_workload_pk"), ["workload_pk"], unique=False)

    op.create_table(
        "performance_results",
        sa.Column("workload_pk", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("samples_ms", sa.JSON(), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("floor_ms", sa.Float(), nullable=True),
        sa.Column("compile_s", sa.Float(), nullable=True),
        sa.Column("peak_mem_bytes", sa.BigInteger(), nullable=True),
        sa.Column("kernels_in_graphs", sa.Integer(), nullable=True),
        sa.Column("kernel_launches", sa.Integer(), nullable=True),
        sa.Column("graph_launches", sa.Integer(), nullable=True),
        sa.Column("copy_bytes_per_replay", sa.BigInteger(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("record_key", sa.String(length=512), nullable=False),
        sa.Column("nodeid", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["workload_pk"],
            ["workloads.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_pk", "record_key"),
    )
    with op.batch_alter_table("performance_results", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_performance_results_run_pk"), ["run_pk"], unique=False)
        batch_op.create_index(batch_op.f("ix_performance_results_workload_pk"), ["workload_pk"], unique=False)

    op.create_table(
        "pi_stage_results",
        sa.Column("subject", sa.String(length=255), nullable=False),
        sa.Column("stage", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("triton_version", sa.String(length=64), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("record_key", sa.String(length=512), nullable=False),
        sa.Column("nodeid", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_pk", "record_key"),
    )
    with op.batch_alter_table("pi_stage_results", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_pi_stage_results_run_pk"), ["run_pk"], unique=False)

    op.create_table(
        "test_outcomes",
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("worker", sa.String(length=32), nullable=True),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("record_key", sa.String(length=512), nullable=False),
        sa.Column("nodeid", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_pk", "record_key"),
    )
    with op.batch_alter_table("test_outcomes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_test_outcomes_run_pk"), ["run_pk"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("test_outcomes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_test_outcomes_run_pk"))

    op.drop_table("test_outcomes")
    with op.batch_alter_table("pi_stage_results", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pi_stage_results_run_pk"))

    op.drop_table("pi_stage_results")
    with op.batch_alter_table("performance_results", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_performance_results_workload_pk"))
        batch_op.drop_index(batch_op.f("ix_performance_results_run_pk"))

    op.drop_table("performance_results")
    with op.batch_alter_table("diagnostics", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_diagnostics_workload_pk"))
        batch_op.drop_index(batch_op.f("ix_diagnostics_run_pk"))

    op.drop_table("diagnostics")
    with op.batch_alter_table("correctness_results", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_correctness_results_workload_pk"))
        batch_op.drop_index(batch_op.f("ix_correctness_results_run_pk"))

    op.drop_table("correctness_results")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_label"))
        batch_op.drop_index(batch_op.f("ix_runs_cell_pk"))

    op.drop_table("runs")
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workloads_name"))

    op.drop_table("workloads")
    op.drop_table("expected_statuses")
    with op.batch_alter_table("cells", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_cells_cell_id"))

    op.drop_table("cells")

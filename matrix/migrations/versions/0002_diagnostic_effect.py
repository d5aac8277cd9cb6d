"""Diagnostics carry the effect of a reason on capture (disables graphs, splits a graph, re-records).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("diagnostics") as batch:
        batch.add_column(sa.Column("effect", sa.String(length=32), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("diagnostics") as batch:
        batch.drop_column("effect")

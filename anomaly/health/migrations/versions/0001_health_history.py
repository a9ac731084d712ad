"""The health history: runs, nodes, checks, metrics.

Revision ID: 0001
Revises:
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "health_runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("started", sa.DateTime, nullable=False),
        sa.Column("finished", sa.DateTime, nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("facts", sa.Text, nullable=False),
        sa.Column("suspects", sa.Text, nullable=False),
    )
    op.create_index("ix_health_runs_started", "health_runs", ["started"])
    op.create_table(
        "health_nodes",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("health_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
    )
    op.create_index("ix_health_nodes_run_id", "health_nodes", ["run_id"])
    op.create_index("ix_health_nodes_host", "health_nodes", ["host"])
    op.create_table(
        "health_checks",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("health_nodes.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("evidence", sa.Text, nullable=False),
    )
    op.create_index("ix_health_checks_node_id", "health_checks", ["node_id"])
    op.create_table(
        "health_metrics",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("check_id", sa.Integer, sa.ForeignKey("health_checks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("unit", sa.String(32), nullable=False),
        sa.Column("higher_is_better", sa.Boolean, nullable=True),
        sa.Column("baseline", sa.Float, nullable=True),
    )
    op.create_index("ix_health_metrics_check_id", "health_metrics", ["check_id"])


def downgrade() -> None:
    for table in ("health_metrics", "health_checks", "health_nodes", "health_runs"):
        op.drop_table(table)

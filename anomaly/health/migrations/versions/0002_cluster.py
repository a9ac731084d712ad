"""Each run names its cluster; a cluster's run is stored once (several clusters share a history).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("health_runs") as batch:
        batch.add_column(sa.Column("cluster", sa.String(255), nullable=False, server_default=""))
        batch.create_index("ix_health_runs_cluster", ["cluster"])
        batch.create_unique_constraint("uq_health_runs_cluster_started", ["cluster", "started"])


def downgrade() -> None:
    with op.batch_alter_table("health_runs") as batch:
        batch.drop_constraint("uq_health_runs_cluster_started", type_="unique")
        batch.drop_index("ix_health_runs_cluster")
        batch.drop_column("cluster")

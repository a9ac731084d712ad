"""Alembic's environment for the health history: runs on the connection History opened."""

from alembic import context

from dpro.anomaly.health.history import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

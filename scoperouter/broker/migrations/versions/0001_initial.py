"""initial schema: instances, bindings, operations

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-23 14:39:58.421429
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instances",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("service_id", sa.String(length=255), nullable=False),
        sa.Column("plan_id", sa.String(length=255), nullable=False),
        sa.Column("service_name", sa.String(length=255), nullable=False),
        sa.Column("parameters", sa.JSON(), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.Column("organization_guid", sa.String(length=255), nullable=True),
        sa.Column("space_guid", sa.String(length=255), nullable=True),
        sa.Column("cloud", sa.String(length=255), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("maintenance_version", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("active_operation_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "bindings",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("instance_id", sa.String(length=255), nullable=False),
        sa.Column("service_id", sa.String(length=255), nullable=False),
        sa.Column("plan_id", sa.String(length=255), nullable=False),
        sa.Column("parameters", sa.JSON(), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.Column("bind_resource", sa.JSON(), nullable=False),
        sa.Column("predecessor_binding_id", sa.String(length=255), nullable=True),
        sa.Column("credentials", sa.Text(), nullable=True),
        sa.Column("endpoints", sa.JSON(), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("renew_before", sa.DateTime(), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("asynchronous", sa.Boolean(), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["instance_id"], ["instances.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("bindings", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_bindings_instance_id"), ["instance_id"], unique=False)

    op.create_table(
        "operations",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("instance_id", sa.String(length=255), nullable=False),
        sa.Column("binding_id", sa.String(length=255), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("accepts_incomplete", sa.Boolean(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("not_before", sa.DateTime(), nullable=False),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("deadline_at", sa.DateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("originating_identity", sa.JSON(), nullable=True),
        sa.Column("request_identity", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["instance_id"], ["instances.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    with op.batch_alter_table("operations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_operations_binding_id"), ["binding_id"], unique=False)
        batch_op.create_index("ix_operations_due", ["state", "not_before"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_operations_instance_id"), ["instance_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("operations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_operations_instance_id"))
        batch_op.drop_index("ix_operations_due")
        batch_op.drop_index(batch_op.f("ix_operations_binding_id"))

    op.drop_table("operations")
    with op.batch_alter_table("bindings", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_bindings_instance_id"))

    op.drop_table("bindings")
    op.drop_table("instances")

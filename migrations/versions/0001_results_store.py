"""Results store: models, token sources, runs, record rows, neurons and their top tokens.

Revision ID: 0001
Revises:
Create Date: 2026-02-01

Written by hand (DuckDB cannot be reflected). A frozen copy of the schema at this revision: it
must not import the application's models, which move on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SEQUENCES = ("models_id_seq", "token_sources_id_seq", "runs_id_seq")


def upgrade() -> None:
    for name in SEQUENCES:
        op.execute(sa.schema.CreateSequence(sa.Sequence(name)))
    op.create_table(
        "models",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("spec_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.String, nullable=False),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("revision", sa.String),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("architecture", sa.String),
        *(sa.Column(name, sa.Integer) for name in (
            "n_layers", "d_model", "n_heads", "d_mlp", "d_vocab", "d_vocab_real", "n_ctx")),
        sa.Column("n_params", sa.BigInteger),
        sa.Column("normalization_type", sa.String),
        sa.Column("parallel_attn_mlp", sa.Boolean),
        *(sa.Column(name, sa.Boolean) for name in (
            "fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")),
        sa.Column("processing_notes", sa.JSON),
        sa.Column("registered_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "token_sources",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("spec_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("path", sa.String),
        sa.Column("n_sequences", sa.Integer, nullable=False),
        sa.Column("seq_len", sa.Integer, nullable=False),
        sa.Column("seed", sa.Integer, nullable=False),
        sa.Column("fingerprint", sa.String),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("registered_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("model_id", sa.BigInteger, sa.ForeignKey("models.id"), nullable=False),
        sa.Column("token_source_id", sa.BigInteger, sa.ForeignKey("token_sources.id"),
                  nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("metric_version", sa.String, nullable=False),
        sa.Column("code_version", sa.String, nullable=False),
        # JSON, not LIST: DuckDB cannot update a LIST column of a row that a foreign key references.
        sa.Column("families", sa.JSON, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("progress", sa.Double, nullable=False),
        sa.Column("error", sa.String),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("started_at", sa.DateTime),
        sa.Column("finished_at", sa.DateTime),
        sa.Column("device", sa.String),
        sa.Column("dtype", sa.String, nullable=False),
        sa.Column("tokens_evaluated", sa.BigInteger),
        sa.Column("wall_s", sa.Double),
        sa.Column("environment", sa.JSON),
        sa.Column("n_records", sa.BigInteger),
        sa.UniqueConstraint("config_hash", "metric_version"),
        sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed')"),
        sa.CheckConstraint("progress >= 0 AND progress <= 1"),
    )
    # Record rows and neurons: no key in the database (a unique ART index would tax every bulk
    # insert); the ingest refuses duplicate keys, and zone maps on run_id find a run's rows.
    op.create_table(
        "results",
        sa.Column("run_id", sa.BigInteger, sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("metric", sa.String, nullable=False),
        sa.Column("layer", sa.Integer),
        sa.Column("component", sa.String),
        sa.Column("head", sa.Integer),
        sa.Column("neuron", sa.Integer),
        sa.Column("value", sa.Double, nullable=False),
        sa.Column("stderr", sa.Double),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.Column("unit", sa.String, nullable=False),
    )
    op.create_table(
        "neurons",
        sa.Column("run_id", sa.BigInteger, sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("layer", sa.Integer, nullable=False),
        sa.Column("neuron", sa.Integer, nullable=False),
        *(sa.Column(name, sa.Double, nullable=False) for name in (
            "vocab_mean", "vocab_var", "vocab_skew", "vocab_kurt")),
        sa.Column("n", sa.BigInteger, nullable=False),
        *(sa.Column(name, sa.Boolean, nullable=False) for name in (
            "prediction", "suppression", "partition")),
    )
    op.create_table(
        "neuron_tokens",
        sa.Column("run_id", sa.BigInteger, sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("layer", sa.Integer, nullable=False),
        sa.Column("neuron", sa.Integer, nullable=False),
        sa.Column("neuron_class", sa.String, nullable=False),
        sa.Column("direction", sa.String, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("token_id", sa.BigInteger, nullable=False),
        sa.Column("token", sa.String, nullable=False),
        sa.Column("cosine", sa.Double, nullable=False),
        sa.CheckConstraint("neuron_class IN ('prediction', 'suppression', 'partition')"),
        sa.CheckConstraint("direction IN ('promoted', 'suppressed')"),
    )


def downgrade() -> None:
    for table in ("neuron_tokens", "neurons", "results", "runs", "token_sources", "models"):
        op.drop_table(table)
    for name in reversed(SEQUENCES):
        op.execute(sa.schema.DropSequence(sa.Sequence(name)))

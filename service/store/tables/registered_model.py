"""`models`: a model the store has results for — the weights and how they were processed.

Identity is `spec_hash`, the SHA-256 of the model spec without its dtype (the dtype is a property
of a run): the same weights processed differently are different registered models, so their
results are never mixed under one name. Architecture numbers and the processing actually applied
are known once the model has been loaded; they are filled at the first ingest.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from service.store.tables.base import Base, utcnow


class RegisteredModelRow(Base):
    __tablename__ = "models"

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Sequence("models_id_seq"), primary_key=True)
    spec_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    name: Mapped[str]
    source: Mapped[str]
    revision: Mapped[str | None]
    spec: Mapped[dict[str, Any]]
    architecture: Mapped[str | None]
    n_layers: Mapped[int | None]
    d_model: Mapped[int | None]
    n_heads: Mapped[int | None]
    d_mlp: Mapped[int | None]
    d_vocab: Mapped[int | None]
    d_vocab_real: Mapped[int | None]
    n_ctx: Mapped[int | None]
    n_params: Mapped[int | None] = mapped_column(sa.BigInteger)
    normalization_type: Mapped[str | None]
    parallel_attn_mlp: Mapped[bool | None]
    # Processing actually applied (docs/metrics.md: shared conventions); requested flags are
    # in `spec`.
    fold_ln: Mapped[bool | None]
    center_writing_weights: Mapped[bool | None]
    center_unembed: Mapped[bool | None]
    fold_value_biases: Mapped[bool | None]
    processing_notes: Mapped[list[str] | None]
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)

"""The store's tables, one module each, on one declarative `Base` (its metadata is the schema
that the migrations must produce; `tests/integration/test_store_migrations.py` checks they do).

`JobRow` (`jobs`), `RunRow` (`runs`), `RegisteredModelRow` (`models`) and `NeuronStatsRow`
(`neurons`) end in `Row` because `Job`, `Run`, `Model` and `NeuronRow` name the API's schemas of
the same things (`service.schemas`), and "model" alone would also mean an ML model."""

from service.store.tables.base import Base, utcnow
from service.store.tables.family import RefitFamily, RefitFamilyMember
from service.store.tables.family_settings import RefitFamilySettings
from service.store.tables.job import FINAL_STATES, JOB_STATES, LIVE_STATES, JobRow, JobState
from service.store.tables.neuron import (
    NEURON_COLUMNS,
    NEURON_TOKEN_COLUMNS,
    NeuronStatsRow,
    NeuronToken,
)
from service.store.tables.parity import ParityReportRow
from service.store.tables.registered_model import RegisteredModelRow
from service.store.tables.result import RESULT_COLUMNS, Result
from service.store.tables.run import RUN_STATUSES, RunRow, RunStatus
from service.store.tables.run_lens import RunLens
from service.store.tables.run_pin import PIN_ACTIONS, RunPin
from service.store.tables.run_resource import RunResource
from service.store.tables.sequence_mean import SEQUENCE_MEAN_COLUMNS, SequenceMean
from service.store.tables.stage import StageBoundary
from service.store.tables.token_source import TokenSource

__all__ = [
    "FINAL_STATES",
    "JOB_STATES",
    "LIVE_STATES",
    "NEURON_COLUMNS",
    "NEURON_TOKEN_COLUMNS",
    "PIN_ACTIONS",
    "RESULT_COLUMNS",
    "RUN_STATUSES",
    "SEQUENCE_MEAN_COLUMNS",
    "Base",
    "JobRow",
    "JobState",
    "NeuronStatsRow",
    "NeuronToken",
    "ParityReportRow",
    "RefitFamily",
    "RefitFamilyMember",
    "RefitFamilySettings",
    "RegisteredModelRow",
    "Result",
    "RunLens",
    "RunPin",
    "RunResource",
    "RunRow",
    "RunStatus",
    "SequenceMean",
    "StageBoundary",
    "TokenSource",
    "utcnow",
]

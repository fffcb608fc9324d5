"""The store's tables, one module each, on one declarative `Base` (its metadata is the schema
that the migrations must produce; `tests/integration/test_store_migrations.py` checks they do)."""

from service.store.models.base import Base, utcnow
from service.store.models.family import RefitFamily, RefitFamilyMember
from service.store.models.job import FINAL_STATES, JOB_STATES, LIVE_STATES, Job, JobState
from service.store.models.neuron import NEURON_COLUMNS, NEURON_TOKEN_COLUMNS, NeuronRow, NeuronToken
from service.store.models.registered_model import RegisteredModel
from service.store.models.result import RESULT_COLUMNS, Result
from service.store.models.run import RUN_STATUSES, Run, RunStatus
from service.store.models.sequence_mean import SEQUENCE_MEAN_COLUMNS, SequenceMean
from service.store.models.stage import StageBoundary
from service.store.models.token_source import TokenSource

__all__ = [
    "FINAL_STATES", "JOB_STATES", "LIVE_STATES", "NEURON_COLUMNS", "NEURON_TOKEN_COLUMNS",
    "RESULT_COLUMNS", "RUN_STATUSES", "SEQUENCE_MEAN_COLUMNS", "Base", "Job", "JobState",
    "NeuronRow", "NeuronToken",
    "RefitFamily", "RefitFamilyMember", "RegisteredModel", "Result", "Run", "RunStatus",
    "SequenceMean", "StageBoundary", "TokenSource", "utcnow",
]

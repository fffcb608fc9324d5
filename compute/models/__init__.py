"""Models: the spec that identifies a run's weights, the sources that load them, and the model
layer the metrics talk to. This package is the only place that boots TransformerLens (4: every
model is a `TransformerBridge`).

  spec        `ModelSpec`, `Processing`: what identifies the weights a run analyses
  sources     the source registry (`SOURCES`): a reference to a spec (`resolve_model_spec`)
              and a spec to weights
  bridge      booting a bridge (Hugging Face or native), its weight processing, the inputs
              each block takes besides the residual; TransformerLens's adapters, read cheaply
  refusals    what Strata refuses to load and why, from config.json alone
  processing  which weight processing the architecture allows
  parity      the parity report: Strata's forward against the Hugging Face forward
  loaded      `LoadedModel`, the operations the metrics are built from, and `load_model`;
              `SplitModel`, a model split over devices (`compute.placement`)
  split       a split model's weights moved where the plan puts them

>>> spec = resolve_model_spec("zoo:tiny-4l-s0")   # doctest: +SKIP
>>> lm = load_model(spec)                           # doctest: +SKIP
"""

from compute.models.loaded import BlockRun, LoadedModel, SplitModel, load_model
from compute.models.parity import PARITY_TOLERANCE, ParityReport
from compute.models.processing import AppliedProcessing, effective_processing
from compute.models.sources import (
    SOURCES,
    ModelSource,
    import_engine,
    resolve_model_spec,
    zoo_names,
)
from compute.models.spec import TORCH_DTYPES, DType, ModelSpec, Processing

__all__ = [
    "PARITY_TOLERANCE",
    "SOURCES",
    "TORCH_DTYPES",
    "AppliedProcessing",
    "BlockRun",
    "DType",
    "LoadedModel",
    "ModelSource",
    "ModelSpec",
    "ParityReport",
    "Processing",
    "SplitModel",
    "effective_processing",
    "import_engine",
    "load_model",
    "resolve_model_spec",
    "zoo_names",
]

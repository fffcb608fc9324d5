"""The registry of metric families, shared by the CLI, the workers and the API."""

from __future__ import annotations

from compute.errors import UnknownMetricError
from compute.metrics.attention import AttentionFamily
from compute.metrics.base import Family
from compute.metrics.heads import HeadsFamily
from compute.metrics.interventions import InterventionFamily
from compute.metrics.logit_lens import LogitLensFamily
from compute.metrics.neurons import NeuronsFamily
from compute.metrics.norms import NormsFamily
from compute.metrics.similarity import SimilarityFamily
from compute.metrics.tuned_lens import TunedLensFamily

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        InterventionFamily(),
        LogitLensFamily(),
        NeuronsFamily(),
        SimilarityFamily(),
        AttentionFamily(),
        NormsFamily(),
        HeadsFamily(),
        TunedLensFamily(),
    )
}
# The tuned lens trains a lens before its first run on a model (minutes on a CPU at SmolLM2's
# size): asked for by name, not part of the default run.
DEFAULT_FAMILIES = tuple(name for name in FAMILIES if name != "tuned_lens")


def families_named(names: list[str] | tuple[str, ...]) -> list[Family]:
    """Look families up by name; unknown names raise with the list of valid ones."""
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise UnknownMetricError(
            f"unknown metric famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
            f"choose from {', '.join(FAMILIES)}"
        )
    if not names:
        raise UnknownMetricError(f"no metric family given; choose from {', '.join(FAMILIES)}")
    return [FAMILIES[n] for n in dict.fromkeys(names)]

"""The registry of metric families, shared by the CLI, the workers and the API."""

from __future__ import annotations

from compute.errors import UnknownMetricError
from compute.metrics.attention import AttentionFamily
from compute.metrics.base import Family
from compute.metrics.heads import HeadsFamily
from compute.metrics.heads_atp import HeadsAtpFamily
from compute.metrics.heads_screen import HeadsScreenFamily
from compute.metrics.interventions import InterventionFamily
from compute.metrics.logit_lens import LogitLensFamily
from compute.metrics.neurons import NeuronsFamily
from compute.metrics.norms import NormsFamily
from compute.metrics.pruning import PruningFamily
from compute.metrics.pruning_drops import PruningDropsFamily
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
        HeadsAtpFamily(),
        HeadsScreenFamily(),
        TunedLensFamily(),
        PruningFamily(),
        PruningDropsFamily(),
    )
}
# Asked for by name, not part of the default run: the tuned lens trains a lens before its first
# run on a model (minutes on a CPU at SmolLM2's size); the head screen (heads_atp) estimates what
# the default run's exact `heads` family measures, and is for runs that leave `heads` out or
# compare the two (adding it to the default would change every registered model's default run).
# `pruning` costs well under 1% of a default run (docs/metrics.md) and qualifies for it, but the
# service's default run is its own list (service settings `families`, the CLI's `--metrics`):
# adding it there changes every registered model's default-run hash, so it is switched on in all
# three together. `pruning_drops` measures n-block drops at about an intervention kind per width.
# heads_screen (the screen with its exact top k) is opt-in for the same reason as heads_atp.
OPT_IN_FAMILIES = ("tuned_lens", "heads_atp", "heads_screen", "pruning", "pruning_drops")
DEFAULT_FAMILIES = tuple(name for name in FAMILIES if name not in OPT_IN_FAMILIES)


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

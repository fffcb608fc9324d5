"""`strata`: the command line. Thin: parse, build a spec, call compute or the store, report.

One module per command group, each thin over a library function:

    compute.py    strata compute           compute.run
    stability.py  strata stability         compute.refits
    stages.py     strata stages            compute.stages
    lens.py       strata lens ...          compute.lens.store
    zoo.py        strata zoo ...           compute.zoo
    serve.py      strata serve             service.serve
    db.py         strata db ...            service.store (migrate, backup)
    jobs.py       strata jobs ...          the job API (http.py: one request, exit codes)
    families.py   strata families ...      the refit families API (and their stability jobs)
    models.py     strata models ...        the models API, or service.store.registration
    pruning.py    strata pruning ...       the pruning plan and predictor scores API
    worker.py     strata worker, beat      service.worker.launch
    settings.py   strata settings          service.settings_doc

Exit codes: see `service/cli/errors.py` (2 bad input, 3 model not loadable, 4 computation
failed, 5 database held).
"""

from __future__ import annotations

import click

from service.cli import (
    compute,
    db,
    families,
    jobs,
    lens,
    models,
    pruning,
    serve,
    settings,
    stability,
    stages,
    worker,
    zoo,
)


@click.group()
def main() -> None:
    """Strata: layer-level interpretability results for transformer language models."""


for command in (
    compute.compute,
    stability.stability,
    stages.stages,
    lens.lens,
    zoo.zoo,
    serve.serve,
    db.db,
    jobs.jobs,
    families.families,
    models.models,
    pruning.pruning,
    worker.worker,
    worker.beat,
    settings.settings,
):
    main.add_command(command)

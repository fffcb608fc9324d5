"""Jobs: requests to compute a run, queued to Celery workers, owned by the API process.

    errors.py      the job errors (404, 409, 503 at the HTTP boundary)
    configs.py     a submission -> the run configuration it means (checked before queueing)
    board.py       what changes every few seconds, kept in memory: progress, leases, workers
    broker.py      sending a job to the broker (and knowing when the broker is down)
    service.py     submit, cancel, claim, heartbeat, fail, deliver, reconcile, maintain
    families.py    a refit family's stability as a job: planned, submitted, delivered,
                   reconciled when the family or its members change
    parts.py       what those two share: a job as shown, a job to create, a delivery's mark
    watch.py       checkpoint folders appearing in the watch folder

Its queries of the database are the store's (`service.store.job_rows`). Only the API process
runs this package: it is the database's one writer. Workers reach it over HTTP
(`service.worker.client`).
"""

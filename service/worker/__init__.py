"""Celery workers: thin tasks over `compute`, reporting to the API over HTTP.

    app.py       the Celery app, configured from the one settings object
    tasks.py     the tasks: compute a job; ask the API to reconcile (beat's schedule)
    client.py    the worker's HTTP calls to the API (claim, heartbeat, fail, deliver)
    execute.py   running one job: claim, load (cached), compute with progress, deliver
    cache.py     loaded models kept per worker process (LRU by model spec)
    launch.py    `strata worker` / `strata beat` processes and the local supervisor

Workers never open the DuckDB file: the API process is its one writer.
"""

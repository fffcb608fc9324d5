"""The HTTP API (Litestar): thin handlers over the results store.

    app.py           create_app(settings, store): routes, errors, docs, gzip, CORS
    controllers/     one controller per resource; handlers validate and delegate
    queries/         the service layer: resolving models and runs (an in-memory index rebuilt
                     after every write), Polars aggregation (compare, stages), ingest of
                     Arrow IPC (registration is the store's: `service.store.registration`)
    schemas/         msgspec Structs: the typed answers the OpenAPI schema describes
    formats.py       JSON / CSV / Parquet / Arrow IPC, by ?format= or Accept
    caching.py       ETag and Cache-Control of results of finished runs
    auth.py          API keys (writes always; reads when configured private)
    ratelimit.py     reads per client address, writes per API key; 429 with Retry-After
    metrics.py       Prometheus metrics (GET /metrics): request counters, a scrape-time
                     collector of jobs, workers and the database
    errors.py        the error tree and the one error body
    docs.py          OpenAPI 3.1 and documentation pages served without any CDN

SQL lives in `service.store.repositories`; the API builds none from user strings.
"""
